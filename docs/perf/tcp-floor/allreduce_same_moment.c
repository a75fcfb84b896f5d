/* docs/perf/tcp-floor/allreduce_same_moment.c - a 2-rank in-place float all-reduce of S bytes four
 * ways, alternating operation by operation after a barrier so that all see the same machine
 * (session 9; session 12 added the plain socket; was allreduce_3way.c; docs/PERF.md): a plain
 * loop over libfabric (RAW_PROV, default tcp, i.e. tcp;ofi_rxm: reduce-scatter into a temporary
 * buffer, all-gather straight into the output, messages of C bytes, the CQ busy-polled), gcomm,
 * MPI_Allreduce, and plain loopback TCP sockets: one socket, reduced chunk by chunk as the data
 * arrives ("piped"); in two phases as MPICH's (each half exchanged whole, then reduced) over one
 * socket, or over two in single writes, UCX's shape; those phases with MPI_Sendrecv; and, when
 * ALT_ENV="GCOMM_X=... ..." is set, gcomm once more on a communicator made under those variables. Each round is classed by the VM's placement
 * (a cross-core probe, as xcore.c) and the medians are printed per placement. Prints each one's median, 25th and 75th percentile.
 *   mpicc -O2 -I. -o allreduce_same_moment docs/perf/tcp-floor/allreduce_same_moment.c \
 *     build-ofi/libgcomm.a -lfabric -lpthread -lm -ldl -lrt
 *   UCX_TLS=tcp FI_TCP_IFACE=lo FI_NET_IFACE=lo mpiexec -n 2 wrap.sh ./allreduce_same_moment 16777216 40 524288
 * (wrap.sh sets GCOMM_HOSTID per rank, as in PERF.md) */
#include <mpi.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_cm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gcomm.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/socket.h>
static int sfd[2];
/* The same all-reduce over plain loopback TCP sockets. Piped: one socket carries a byte stream of
 * the reduce-scatter half (into tmp), then the all-gather half (into the output), in writes of at
 * most C bytes, reduced chunk by chunk as it arrives. */
static void sockPiped(float*buf,float*tmp,size_t S,size_t C,int meR){
  size_t half=S/2;char*mine=(char*)buf+(meR?half:0),*other=(char*)buf+(meR?0:half);
  size_t so=0,ro=0,red=0;int fd=sfd[0];
  while(so<2*half||ro<2*half){
    /* send: RS bytes from other, then AG bytes from mine up to what is reduced */
    size_t lim=so<half?half:half+red; if(so<lim){size_t n=lim-so;if(n>C)n=C;const char*src=so<half?other+so:mine+(so-half);if(so<half&&so+n>half)n=half-so;
      ssize_t r=send(fd,src,n,MSG_NOSIGNAL|MSG_DONTWAIT);if(r>0)so+=r;}
    if(ro<2*half){size_t n=ro<half?half-ro:2*half-ro;char*dst=ro<half?(char*)tmp+ro:other+(ro-half);ssize_t r=recv(fd,dst,n,MSG_DONTWAIT);if(r>0)ro+=r;}
    size_t avail=ro<half?ro:half; while(red+C<=avail||(avail==half&&red<half)){size_t n=half-red<C?half-red:C;float*d=(float*)(mine+red),*s=(float*)((char*)tmp+red);for(size_t i=0;i<n/4;i++)d[i]+=s[i];red+=n;}
    if(so<2*half||ro<2*half){struct pollfd f={fd,(so<(so<half?half:half+red)?POLLOUT:0)|(ro<2*half?POLLIN:0),0};if(f.events)poll(&f,1,1);}
  }
}
/* Both ways at once over ns sockets, each carrying its 1/ns share in writes of at most ch. */
static void sockExchange(int ns,const char*sb,char*rb,size_t len,size_t ch){
  size_t h=len/ns,so[2]={0,0},ro[2]={0,0};
  for(;;){int left=0,moved=0;struct pollfd p[2];int np=0;
    for(int k=0;k<ns;k++){
      if(so[k]<h){size_t n=h-so[k]<ch?h-so[k]:ch;ssize_t r=send(sfd[k],sb+k*h+so[k],n,MSG_NOSIGNAL|MSG_DONTWAIT);if(r>0){so[k]+=r;moved=1;}}
      if(ro[k]<h){ssize_t r=recv(sfd[k],rb+k*h+ro[k],h-ro[k],MSG_DONTWAIT);if(r>0){ro[k]+=r;moved=1;}}
      if(so[k]<h||ro[k]<h){left=1;p[np].fd=sfd[k];p[np].events=(so[k]<h?POLLOUT:0)|(ro[k]<h?POLLIN:0);p[np++].revents=0;}}
    if(!left)break;
    if(!moved)poll(p,np,1);}
}
/* Phases, as MPICH's: the halves exchanged whole, reduced, exchanged whole (ns sockets, writes of
 * at most C; C >= S/2/ns makes each a single write, UCX's shape: two sockets, 4 MB writes). */
static void sockPhases(float*buf,float*tmp,size_t S,size_t C,int meR,int ns){
  size_t half=S/2;char*mine=(char*)buf+(meR?half:0),*other=(char*)buf+(meR?0:half);
  sockExchange(ns,other,(char*)tmp,half,C);
  float*d=(float*)mine;for(size_t i=0;i<half/4;i++)d[i]+=tmp[i];
  sockExchange(ns,mine,other,half,C);
}
/* The VM's placement (docs/perf/tcp-floor/xcore.c), probed before each round: rank 0 writes 1 MB
 * into memory both ranks map, rank 1 reads it, four times; GB/s. */
static char*shbuf;static volatile int*shflag;
static double probe(int rank){
  const size_t P=1<<20;MPI_Barrier(MPI_COMM_WORLD);double t0=MPI_Wtime();
  for(int r=0;r<4;r++){
    if(rank==0){while(__atomic_load_n(shflag,__ATOMIC_ACQUIRE)!=2*r);memset(shbuf,r+1,P);__atomic_store_n(shflag,2*r+1,__ATOMIC_RELEASE);}
    else{while(__atomic_load_n(shflag,__ATOMIC_ACQUIRE)!=2*r+1);volatile long x=0;for(size_t i=0;i<P;i+=8)x+=*(long*)(shbuf+i);__atomic_store_n(shflag,2*r+2,__ATOMIC_RELEASE);}}
  if(rank==0)while(__atomic_load_n(shflag,__ATOMIC_ACQUIRE)!=8);
  double x=MPI_Wtime()-t0;MPI_Barrier(MPI_COMM_WORLD);if(rank==0)*shflag=0;MPI_Barrier(MPI_COMM_WORLD);
  return 4.0*P/x/1e9;}
#define CK(x) do{int e=(x); if(e){fprintf(stderr,"%s: %d %s\n",#x,e,fi_strerror(-e));exit(1);}}while(0)
static struct fid_cq*cq;static struct fid_ep*ep;static fi_addr_t peer;static int me;
typedef struct{int kind,k;}ctx_t;
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static struct fi_context fc[4096];static ctx_t cx[4096];
static void rawAllreduce(float*buf,float*tmp,size_t S,size_t C){
  size_t half=S/2;char*mine=(char*)buf+(me?half:0),*other=(char*)buf+(me?0:half);int n=(half+C-1)/C;int ci=0;
  for(int k=0;k<n;k++){size_t len=half-k*C<C?half-k*C:C;
    cx[ci]=(ctx_t){1,k};while(fi_trecv(ep,(char*)tmp+k*C,len,NULL,FI_ADDR_UNSPEC,k,0,&fc[ci])==-FI_EAGAIN)fi_cq_read(cq,NULL,0);ci++;
    cx[ci]=(ctx_t){2,k};while(fi_trecv(ep,other+k*C,len,NULL,FI_ADDR_UNSPEC,(1ull<<40)|k,0,&fc[ci])==-FI_EAGAIN)fi_cq_read(cq,NULL,0);ci++;}
  // the peer may send before our receives are posted: rxm buffers unexpected eager messages (fine for a floor)
  int rsSent=0,agSent=0,done=0,total=4*n;int rsGot[1024]={0};int nextReduce=0;
  while(done<total){
   if(rsSent<n){size_t len=half-rsSent*C<C?half-rsSent*C:C;cx[ci]=(ctx_t){0,rsSent};if(fi_tsend(ep,other+rsSent*C,len,NULL,peer,rsSent,&fc[ci])==0){rsSent++;ci++;}}
   while(nextReduce<n&&rsGot[nextReduce]){size_t len=half-nextReduce*C<C?half-nextReduce*C:C;float*d=(float*)(mine+nextReduce*C),*s=(float*)((char*)tmp+nextReduce*C);for(size_t i=0;i<len/4;i++)d[i]+=s[i];nextReduce++;}
   if(agSent<nextReduce){size_t len=half-agSent*C<C?half-agSent*C:C;cx[ci]=(ctx_t){0,agSent};if(fi_tsend(ep,mine+agSent*C,len,NULL,peer,(1ull<<40)|agSent,&fc[ci])==0){agSent++;ci++;}}
   struct fi_cq_tagged_entry e[16];ssize_t k=fi_cq_read(cq,e,16);
   for(ssize_t j=0;j<k;j++){ctx_t*c=&cx[(struct fi_context*)e[j].op_context-fc];if(c->kind==1)rsGot[c->k]=1;done++;}
  }
}
int main(int argc,char**argv){MPI_Init(&argc,&argv);MPI_Comm_rank(MPI_COMM_WORLD,&me);
 size_t S=atol(argv[1]);int iters=atoi(argv[2]);size_t C=atol(argv[3]);
 char lim[32];snprintf(lim,32,"%zu",C);setenv("FI_OFI_RXM_EAGER_LIMIT",lim,1);
 struct fi_info*h=fi_allocinfo(),*info;h->caps=FI_TAGGED;h->ep_attr->type=FI_EP_RDM;h->fabric_attr->prov_name=strdup(getenv("RAW_PROV")?getenv("RAW_PROV"):"tcp");
 h->domain_attr->mr_mode=FI_MR_LOCAL|FI_MR_VIRT_ADDR|FI_MR_ALLOCATED|FI_MR_PROV_KEY;h->domain_attr->threading=FI_THREAD_DOMAIN;h->mode=FI_CONTEXT;
 CK(fi_getinfo(FI_VERSION(1,9),NULL,NULL,0,h,&info));
 struct fid_fabric*fab;struct fid_domain*dom;struct fid_av*av;
 CK(fi_fabric(info->fabric_attr,&fab,NULL));CK(fi_domain(fab,info,&dom,NULL));
 struct fi_cq_attr ca={.format=FI_CQ_FORMAT_TAGGED,.size=1024,.wait_obj=FI_WAIT_NONE};CK(fi_cq_open(dom,&ca,&cq,NULL));
 struct fi_av_attr aa={.type=FI_AV_TABLE};CK(fi_av_open(dom,&aa,&av,NULL));
 CK(fi_endpoint(dom,info,&ep,NULL));CK(fi_ep_bind(ep,&cq->fid,FI_TRANSMIT|FI_RECV));CK(fi_ep_bind(ep,&av->fid,0));CK(fi_enable(ep));
 unsetenv("FI_OFI_RXM_EAGER_LIMIT");
 char name[256],names[512];size_t nl=256;CK(fi_getname(&ep->fid,name,&nl));MPI_Allgather(name,256,MPI_CHAR,names,256,MPI_CHAR,MPI_COMM_WORLD);
 fi_av_insert(av,names+256*(1-me),1,&peer,0,NULL);
 gcommComm_t comm;gcommConfig_t cfg=GCOMM_CONFIG_INITIALIZER;cfg.device=GCOMM_DEVICE_HOST;
 if(gcommCommInitMPI(&comm,MPI_COMM_WORLD,&cfg)!=gcommSuccess){fprintf(stderr,"init failed\n");return 1;}
 /* a second gcomm communicator made under ALT_ENV ("VAR=value ..."): two settings at the same moment */
 gcommComm_t alt=NULL;char altEnv[512]="";if(getenv("ALT_ENV"))snprintf(altEnv,sizeof altEnv,"%s",getenv("ALT_ENV"));
 if(altEnv[0]){char copy[512];snprintf(copy,sizeof copy,"%s",altEnv);for(char*v=strtok(copy," ");v;v=strtok(NULL," "))putenv(strdup(v));
  if(gcommCommInitMPI(&alt,MPI_COMM_WORLD,&cfg)!=gcommSuccess){fprintf(stderr,"init (ALT_ENV) failed\n");return 1;}}
 enum{NWAYS=8};float*buf[NWAYS],*tmp=malloc(S/2);for(int b=0;b<NWAYS;b++){buf[b]=malloc(S);for(size_t i=0;i<S/4;i++)buf[b][i]=1;}
 double*t=calloc(NWAYS*iters,sizeof(double)),*pr=calloc(iters,sizeof(double));
 const char*wayNames[NWAYS]={"raw libfabric","gcomm","MPI","socket, piped","socket, phases","2 sockets, phases","MPI_Sendrecv, phases","gcomm, ALT_ENV"};
 for(int k=0;k<2;k++){struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_addr.s_addr=htonl(0x7f000001);
  if(me==0){int s0=socket(AF_INET,SOCK_STREAM,0);bind(s0,(void*)&a,sizeof a);listen(s0,4);socklen_t l=sizeof a;getsockname(s0,(void*)&a,&l);MPI_Send(&a,sizeof a,MPI_BYTE,1,0,MPI_COMM_WORLD);sfd[k]=accept(s0,0,0);close(s0);}
  else{MPI_Recv(&a,sizeof a,MPI_BYTE,0,0,MPI_COMM_WORLD,MPI_STATUS_IGNORE);sfd[k]=socket(AF_INET,SOCK_STREAM,0);while(connect(sfd[k],(void*)&a,sizeof a));}
  int one=1;setsockopt(sfd[k],IPPROTO_TCP,TCP_NODELAY,&one,sizeof one);}
 {MPI_Comm shc;MPI_Comm_split_type(MPI_COMM_WORLD,MPI_COMM_TYPE_SHARED,0,MPI_INFO_NULL,&shc);MPI_Win w;char*base;MPI_Aint sz;int du;
  MPI_Win_allocate_shared(me==0?(1<<20)+4096:0,1,MPI_INFO_NULL,shc,&base,&w);MPI_Win_shared_query(w,0,&sz,&du,&base);
  shflag=(volatile int*)base;shbuf=base+4096;if(me==0)*shflag=0;MPI_Barrier(MPI_COMM_WORLD);}
 for(int it=-5;it<iters;it++){double pb=probe(me);if(it>=0)pr[it]=pb;for(int m=0;m<NWAYS;m++){
  if(m==7&&!alt)continue;
  MPI_Barrier(MPI_COMM_WORLD);double t0=MPI_Wtime();
  if(m==0)rawAllreduce(buf[0],tmp,S,C);
  else if(m==1){gcommAllReduce(buf[1],buf[1],S/4,gcommFloat32,gcommSum,comm,NULL);gcommWait(comm,NULL);}
  else if(m==2)MPI_Allreduce(MPI_IN_PLACE,buf[2],S/4,MPI_FLOAT,MPI_SUM,MPI_COMM_WORLD);
  else if(m==3)sockPiped(buf[m],tmp,S,C,me);
  else if(m==7){gcommAllReduce(buf[7],buf[7],S/4,gcommFloat32,gcommSum,alt,NULL);gcommWait(alt,NULL);}
  else if(m==6){size_t half=S/2;char*mine=(char*)buf[m]+(me?half:0),*other=(char*)buf[m]+(me?0:half);
    MPI_Sendrecv(other,half,MPI_BYTE,1-me,7,tmp,half,MPI_BYTE,1-me,7,MPI_COMM_WORLD,MPI_STATUS_IGNORE);
    float*d=(float*)mine;for(size_t i=0;i<half/4;i++)d[i]+=tmp[i];
    MPI_Sendrecv(mine,half,MPI_BYTE,1-me,8,other,half,MPI_BYTE,1-me,8,MPI_COMM_WORLD,MPI_STATUS_IGNORE);}
  else sockPhases(buf[m],tmp,S,m==5?S:C,me,m==5?2:1);
  double dt=MPI_Wtime()-t0;if(it>=0)t[m*iters+it]=dt;
  for(size_t i=0;i<S/4;i++)buf[m][i]=1; // every way starts from the same values
 }}
 /* rounds by placement: slow when the probe reads under 4 GB/s (fast ~7, slow ~2) */
 if(me==0)for(int slow=1;slow>=0;slow--){int n=0;double*x=calloc(iters,sizeof(double));
  for(int it=0;it<iters;it++)n+=(pr[it]<4.0)==slow;
  printf("%s placement (probe %s 4 GB/s): %d of %d rounds\n",slow?"slow":"fast",slow?"<":">=",n,iters);
  for(int m=0;m<NWAYS&&n>0;m++){if(m==7&&!alt)continue;int k=0;for(int it=0;it<iters;it++)if((pr[it]<4.0)==slow)x[k++]=t[m*iters+it];qsort(x,n,sizeof(double),cmp);
   printf("  S=%zu %-18s in place: median %.1f us, p25 %.1f p75 %.1f\n",S,wayNames[m],x[n/2]*1e6,x[n/4]*1e6,x[3*n/4]*1e6);}
  free(x);}
 if(me==0&&alt)printf("ALT_ENV: %s\n",altEnv);
 if(alt)gcommCommDestroy(alt);
 gcommCommDestroy(comm);MPI_Finalize();return 0;}
