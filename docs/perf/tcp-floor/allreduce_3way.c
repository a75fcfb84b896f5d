/* docs/perf/tcp-floor/allreduce_3way.c - a 2-rank in-place float all-reduce of S bytes three ways,
 * alternating operation by operation after a barrier so that all see the same machine (session 9,
 * docs/PERF.md): a plain loop over libfabric tcp;ofi_rxm (reduce-scatter into a temporary buffer,
 * all-gather straight into the output, messages of C bytes, the CQ busy-polled), gcomm, and
 * MPI_Allreduce. Prints each one's median, 25th and 75th percentile.
 *   mpicc -O2 -I. -o allreduce_3way docs/perf/tcp-floor/allreduce_3way.c build-ofi/libgcomm.a \
 *     -lfabric -lpthread -lm -ldl -lrt
 *   UCX_TLS=tcp GCOMM_OFI_PROVIDER=tcp FI_TCP_IFACE=lo mpiexec -n 2 wrap.sh ./allreduce_3way 2097152 300 262144
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
 struct fi_info*h=fi_allocinfo(),*info;h->caps=FI_TAGGED;h->ep_attr->type=FI_EP_RDM;h->fabric_attr->prov_name=strdup("tcp");
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
 float*buf[3],*tmp=malloc(S/2);for(int b=0;b<3;b++){buf[b]=malloc(S);for(size_t i=0;i<S/4;i++)buf[b][i]=1;}
 double*t=calloc(3*iters,sizeof(double));const char*names3[3]={"raw libfabric","gcomm","MPI"};
 for(int it=-5;it<iters;it++)for(int m=0;m<3;m++){
  MPI_Barrier(MPI_COMM_WORLD);double t0=MPI_Wtime();
  if(m==0)rawAllreduce(buf[0],tmp,S,C);
  else if(m==1){gcommAllReduce(buf[1],buf[1],S/4,gcommFloat32,gcommSum,comm,NULL);gcommWait(comm,NULL);}
  else MPI_Allreduce(MPI_IN_PLACE,buf[2],S/4,MPI_FLOAT,MPI_SUM,MPI_COMM_WORLD);
  double dt=MPI_Wtime()-t0;if(it>=0)t[m*iters+it]=dt;
  for(size_t i=0;i<S/4;i+=1024)buf[m][i]=1; // keep values bounded-ish
 }
 if(me==0)for(int m=0;m<3;m++){qsort(t+m*iters,iters,sizeof(double),cmp);printf("S=%zu %-14s in place: median %.1f us, p25 %.1f p75 %.1f\n",S,names3[m],t[m*iters+iters/2]*1e6,t[m*iters+iters/4]*1e6,t[m*iters+3*iters/4]*1e6);}
 gcommCommDestroy(comm);MPI_Finalize();return 0;}
