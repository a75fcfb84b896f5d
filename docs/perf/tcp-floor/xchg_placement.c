/* docs/perf/tcp-floor/xchg_placement.c - what moves S bytes each way fastest between 2 MPI ranks
 * over loopback TCP in each of the VM's placements (session 12, docs/PERF.md): MPI_Sendrecv (MPICH
 * over UCX's tcp) against plain sockets, one or two, writes of C bytes or whole shares, sending
 * first or interleaved, and vmsplice. Before each round a cross-core probe (rank 0 writes 1 MB
 * into shared memory, rank 1 reads it, as xcore.c) classes the round as the slow placement (under
 * 4 GB/s) or the fast one; medians are printed per placement.
 *   mpicc -O2 -o xchg_placement docs/perf/tcp-floor/xchg_placement.c
 *   UCX_TLS=tcp mpiexec -n 2 ./xchg_placement 8388608 100 1048576    (S, rounds, C) */
#define _GNU_SOURCE
#include <mpi.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>
static char*shbuf; static volatile int*flag;
static double probe(int rank){ /* 1 MB hand-off rank0 -> rank1, 4 times; GB/s as rank 0 sees it */
  const size_t P=1<<20; MPI_Barrier(MPI_COMM_WORLD); double t0=MPI_Wtime();
  for(int r=0;r<4;r++){
    if(rank==0){while(__atomic_load_n(flag,__ATOMIC_ACQUIRE)!=2*r);memset(shbuf,r+1,P);__atomic_store_n(flag,2*r+1,__ATOMIC_RELEASE);}
    else{while(__atomic_load_n(flag,__ATOMIC_ACQUIRE)!=2*r+1);volatile long s=0;for(size_t i=0;i<P;i+=8)s+=*(long*)(shbuf+i);__atomic_store_n(flag,2*r+2,__ATOMIC_RELEASE);}
  }
  if(rank==0)while(__atomic_load_n(flag,__ATOMIC_ACQUIRE)!=8);
  double x=MPI_Wtime()-t0; MPI_Barrier(MPI_COMM_WORLD); if(rank==0)*flag=0; MPI_Barrier(MPI_COMM_WORLD);
  return 4.0*P/x/1e9;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static int fd, fd2, pp[2]; static size_t C;
/* v1: nonblocking send/recv chunks C, poll; v2: same with splice; v3: blocking-ish: send C then recv */
static void xchg2(char*sb,char*rb,size_t S,int ns,size_t ch,int sendFirst){ /* ns sockets, each a 1/ns share; writes of at most ch */
  size_t h=S/ns,so[2]={0,0},ro[2]={0,0};int f[2]={fd,fd2};
  for(;;){int left=0;for(int k=0;k<ns;k++)left|=so[k]<h||ro[k]<h;if(!left)break;int sent=0;
    for(int k=0;k<ns;k++)if(so[k]<h){size_t n=h-so[k]<ch?h-so[k]:ch;ssize_t r=send(f[k],sb+k*h+so[k],n,MSG_NOSIGNAL);if(r>0){so[k]+=r;sent=1;}}
    if(sent&&sendFirst)continue;
    for(int k=0;k<ns;k++)if(ro[k]<h){ssize_t r=recv(f[k],rb+k*h+ro[k],h-ro[k],0);if(r>0)ro[k]+=r;}
    struct pollfd p[2];int np=0;for(int k=0;k<ns;k++){p[np].fd=f[k];p[np].events=(so[k]<h?POLLOUT:0)|(ro[k]<h?POLLIN:0);p[np].revents=0;if(p[np].events)np++;}
    if(np&&!sent)poll(p,np,1);
  }
}
static void xchg(char*sb,char*rb,size_t S,int v){
  size_t so=0,ro=0,inpipe=0;
  while(so<S||ro<S||inpipe){
   if(v==3){ while(so<S){size_t n=S-so<C?S-so:C;ssize_t r=send(fd,sb+so,n,MSG_NOSIGNAL);if(r<=0)break;so+=r;} }
   else if(v==1){ if(so<S){size_t n=S-so<C?S-so:C;ssize_t r=send(fd,sb+so,n,MSG_NOSIGNAL);if(r>0)so+=r;} }
   else { if(so<S){size_t n=S-so<C?S-so:C;struct iovec iv={sb+so,n};ssize_t r=vmsplice(pp[1],&iv,1,SPLICE_F_NONBLOCK);if(r>0){so+=r;inpipe+=r;}}
     if(inpipe){ssize_t r=splice(pp[0],0,fd,0,inpipe,SPLICE_F_NONBLOCK|SPLICE_F_MORE);if(r>0)inpipe-=r;} }
   if(ro<S){ssize_t r=recv(fd,rb+ro,S-ro,0);if(r>0)ro+=r;}
   if(so<S||ro<S||inpipe){struct pollfd f={fd,((so<S||inpipe)?POLLOUT:0)|(ro<S?POLLIN:0),0};poll(&f,1,10);}
  }
}
int main(int argc,char**argv){MPI_Init(&argc,&argv);int rank;MPI_Comm_rank(MPI_COMM_WORLD,&rank);
 size_t S=atol(argv[1]);int iters=atoi(argv[2]);C=atol(argv[3]);
 struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_addr.s_addr=htonl(0x7f000001);
 if(rank==0){int s=socket(AF_INET,SOCK_STREAM,0);bind(s,(void*)&a,sizeof a);listen(s,4);socklen_t l=sizeof a;getsockname(s,(void*)&a,&l);MPI_Send(&a,sizeof a,MPI_BYTE,1,0,MPI_COMM_WORLD);fd=accept(s,0,0);}
 else{MPI_Recv(&a,sizeof a,MPI_BYTE,0,0,MPI_COMM_WORLD,MPI_STATUS_IGNORE);fd=socket(AF_INET,SOCK_STREAM,0);while(connect(fd,(void*)&a,sizeof a));}
 if(rank==0){int s=socket(AF_INET,SOCK_STREAM,0);a.sin_port=0;bind(s,(void*)&a,sizeof a);listen(s,4);socklen_t l=sizeof a;getsockname(s,(void*)&a,&l);MPI_Send(&a,sizeof a,MPI_BYTE,1,0,MPI_COMM_WORLD);fd2=accept(s,0,0);}
 else{MPI_Recv(&a,sizeof a,MPI_BYTE,0,0,MPI_COMM_WORLD,MPI_STATUS_IGNORE);fd2=socket(AF_INET,SOCK_STREAM,0);while(connect(fd2,(void*)&a,sizeof a));}
 int one=1;setsockopt(fd,IPPROTO_TCP,TCP_NODELAY,&one,sizeof one);fcntl(fd,F_SETFL,O_NONBLOCK);setsockopt(fd2,IPPROTO_TCP,TCP_NODELAY,&one,sizeof one);fcntl(fd2,F_SETFL,O_NONBLOCK);
 pipe2(pp,O_NONBLOCK);fcntl(pp[1],F_SETPIPE_SZ,1<<20);
 char*sb=aligned_alloc(4096,S),*rb=aligned_alloc(4096,S);memset(sb,1,S);memset(rb,0,S);
 MPI_Comm shc;MPI_Comm_split_type(MPI_COMM_WORLD,MPI_COMM_TYPE_SHARED,0,MPI_INFO_NULL,&shc);MPI_Win w;char*base;
 MPI_Win_allocate_shared(rank==0?(1<<20)+4096:0,1,MPI_INFO_NULL,shc,&base,&w);MPI_Aint sz;int du;MPI_Win_shared_query(w,0,&sz,&du,&base);flag=(volatile int*)base;shbuf=base+4096;if(rank==0)*flag=0;MPI_Barrier(MPI_COMM_WORLD);
 int nv=argc>4?atoi(argv[4]):9;double*pr=calloc(iters,sizeof(double));double*t=calloc(nv*iters,sizeof(double));
 for(int it=-3;it<iters;it++){double pb=probe(rank);if(it>=0)pr[it]=pb;for(int v=0;v<nv;v++){MPI_Barrier(MPI_COMM_WORLD);memset(sb,it,S);double t0=MPI_Wtime();
   if(v==0)MPI_Sendrecv(sb,S,MPI_BYTE,1-rank,1,rb,S,MPI_BYTE,1-rank,1,MPI_COMM_WORLD,MPI_STATUS_IGNORE);
   else if(v==4)xchg2(sb,rb,S,2,S,1);
   else if(v==5)xchg2(sb,rb,S,1,S,1);
   else if(v==6)xchg2(sb,rb,S,2,C,0);
   else if(v==7)xchg2(sb,rb,S,2,S,0);
   else if(v==8)xchg2(sb,rb,S,1,S,0);
   else xchg(sb,rb,S,v);
   double x=MPI_Wtime()-t0; if(it>=0)t[v*iters+it]=x*1e6;}}
 if(rank==0){const char*nm[9]={"MPI_Sendrecv","1 sock, C, interleaved","vmsplice","1 sock, C, send first","2 sock, whole, send first","1 sock, whole, send first","2 sock, C, interleaved","2 sock, whole, interleaved","1 sock, whole, interleaved"};
  for(int reg=0;reg<2;reg++){int n=0;for(int it=0;it<iters;it++)n+=(pr[it]<4.0)==(reg==0);
   printf("%s placement (probe %s 4 GB/s): %d iterations\n",reg==0?"slow":"fast",reg==0?"<":">=",n);if(!n)continue;
   double*tmp=calloc(n,sizeof(double));
   for(int v=0;v<nv;v++){int k=0;for(int it=0;it<iters;it++)if((pr[it]<4.0)==(reg==0))tmp[k++]=t[v*iters+it];qsort(tmp,n,sizeof(double),cmp);printf("  S=%zu %-22s median %.1f us p25 %.1f p75 %.1f\n",S,nm[v],tmp[n/2],tmp[n/4],tmp[3*n/4]);}
   free(tmp);}}
 MPI_Finalize();return 0;}
