/* docs/perf/tcp-floor/xchg_socket.c - the kernel's floor for what a 2-rank all-reduce moves over
 * loopback TCP (session 9, docs/PERF.md): two processes exchange S bytes each way on one socket,
 * in messages of an H-byte header and C bytes of payload (as rxm frames gcomm's slots), both
 * directions at once, non-blocking, polling. SNDBUF > 0 sets SO_SNDBUF on both ends (0: the
 * kernel's autotuning). The header sizes given alternate, iteration by iteration, so each sees
 * the same machine; prints the median per exchange.
 *   gcc -O2 -o xchg_socket xchg_socket.c && ./xchg_socket S C ITERS SNDBUF H...
 *   e.g. ./xchg_socket 2097152 262144 200 0 32     (2 MB each way, 256 KB slots, autotuned) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){size_t S=atol(argv[1]),C=atol(argv[2]);int iters=atoi(argv[3]);int sbuf=atoi(argv[4]);int nh=argc-5;int H[8];for(int i=0;i<nh;i++)H[i]=atoi(argv[5+i]);
 int s=socket(AF_INET,SOCK_STREAM,0);struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_addr.s_addr=htonl(0x7f000001);bind(s,(void*)&a,sizeof a);listen(s,4);socklen_t l=sizeof a;getsockname(s,(void*)&a,&l);
 pid_t pid=fork();int fd;
 if(pid){fd=accept(s,0,0);}else{fd=socket(AF_INET,SOCK_STREAM,0);while(connect(fd,(void*)&a,sizeof a));}
 int one=1;setsockopt(fd,IPPROTO_TCP,TCP_NODELAY,&one,sizeof one);fcntl(fd,F_SETFL,O_NONBLOCK);if(sbuf>0){setsockopt(fd,SOL_SOCKET,SO_SNDBUF,&sbuf,sizeof sbuf);}
 char*sb=aligned_alloc(4096,S),*rb=aligned_alloc(4096,S);memset(sb,1,S);memset(rb,0,S);char hdr[4096]={0},rh[4096];
 double*t=calloc(nh*iters,sizeof(double));
 for(int it=-5;it<iters;it++)for(int m=0;m<nh;m++){int h=H[m];size_t n=(S+C-1)/C;
  // message stream: [h hdr][C data] ...; track send pos and recv pos in the stream
  size_t msg=h+C, tot=n*msg, so=0, ro=0; double t0=now();
  while(so<tot||ro<tot){
   if(so<tot){size_t k=so/msg,off=so%msg;struct iovec v[2];int nv=0;
     if(off<(size_t)h){v[nv].iov_base=hdr+off;v[nv++].iov_len=h-off;v[nv].iov_base=sb+k*C;v[nv++].iov_len=C;}
     else{v[nv].iov_base=sb+k*C+(off-h);v[nv++].iov_len=C-(off-h);}
     struct msghdr mh={0};mh.msg_iov=v;mh.msg_iovlen=nv;ssize_t r=sendmsg(fd,&mh,MSG_NOSIGNAL);if(r>0)so+=r;}
   if(ro<tot){size_t k=ro/msg,off=ro%msg;ssize_t r;
     if(off<(size_t)h)r=recv(fd,rh,h-off,0);else r=recv(fd,rb+k*C+(off-h),C-(off-h),0);if(r>0)ro+=r;}
   if(so<tot||ro<tot){struct pollfd f={fd,(so<tot?POLLOUT:0)|(ro<tot?POLLIN:0),0};poll(&f,1,10);}
  }
  if(it>=0)t[m*iters+it]=now()-t0;}
 if(pid){for(int m=0;m<nh;m++){qsort(t+m*iters,iters,sizeof(double),cmp);printf("S=%zu C=%zu sndbuf=%d hdr=%d: median %.1f us\n",S,C,sbuf,H[m],t[m*iters+iters/2]);}wait(0);}
 return 0;}
