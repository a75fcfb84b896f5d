/* docs/perf/tcp-floor/xchg_ofi.c - the same exchange through libfabric's tcp;ofi_rxm (session 9,
 * docs/PERF.md): two MPI ranks exchange S bytes each way as tagged messages of 256 KB or 1 MB
 * (eager: FI_OFI_RXM_EAGER_LIMIT 2 MB), receives posted before a barrier, the CQ busy-polled, on
 * one endpoint per rank (one TCP connection between them) or with the data arriving at a second
 * endpoint (two connections, one per direction). The four modes alternate iteration by
 * iteration; prints each one's median.
 *   mpicc -O2 -o xchg_ofi xchg_ofi.c -lfabric && FI_TCP_IFACE=lo mpiexec -n 2 ./xchg_ofi S ITERS */
#include <mpi.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_cm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CK(x) do{int e=(x); if(e){fprintf(stderr,"%s: %d %s\n",#x,e,fi_strerror(-e));exit(1);}}while(0)
static struct fid_cq*cq;
static void drain(int*done){struct fi_cq_tagged_entry e[8];ssize_t k=fi_cq_read(cq,e,8);if(k>0)*done+=k;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){MPI_Init(&argc,&argv);int me;MPI_Comm_rank(MPI_COMM_WORLD,&me);
 size_t S=atol(argv[1]);int iters=atoi(argv[2]);
 setenv("FI_OFI_RXM_EAGER_LIMIT","2097152",0);
 struct fi_info*h=fi_allocinfo(),*info;h->caps=FI_TAGGED;h->ep_attr->type=FI_EP_RDM;h->fabric_attr->prov_name=strdup("tcp");
 h->domain_attr->mr_mode=FI_MR_LOCAL|FI_MR_VIRT_ADDR|FI_MR_ALLOCATED|FI_MR_PROV_KEY;h->domain_attr->threading=FI_THREAD_DOMAIN;
 CK(fi_getinfo(FI_VERSION(1,9),NULL,NULL,0,h,&info));
 struct fid_fabric*fab;struct fid_domain*dom;struct fid_av*av;
 CK(fi_fabric(info->fabric_attr,&fab,NULL));CK(fi_domain(fab,info,&dom,NULL));
 struct fi_cq_attr ca={.format=FI_CQ_FORMAT_TAGGED,.size=1024,.wait_obj=FI_WAIT_NONE};CK(fi_cq_open(dom,&ca,&cq,NULL));
 struct fi_av_attr aa={.type=FI_AV_TABLE};CK(fi_av_open(dom,&aa,&av,NULL));
 struct fid_ep*ep[2];
 for(int i=0;i<2;i++){CK(fi_endpoint(dom,info,&ep[i],NULL));CK(fi_ep_bind(ep[i],&cq->fid,FI_TRANSMIT|FI_RECV));CK(fi_ep_bind(ep[i],&av->fid,0));CK(fi_enable(ep[i]));}
 char names[2][2][256];size_t nl=256;char mine[2][256];
 for(int i=0;i<2;i++){nl=256;CK(fi_getname(&ep[i]->fid,mine[i],&nl));}
 MPI_Allgather(mine,512,MPI_CHAR,names,512,MPI_CHAR,MPI_COMM_WORLD);
 fi_addr_t pa[2];for(int i=0;i<2;i++)fi_av_insert(av,names[1-me][i],1,&pa[i],0,NULL);
 char*sb=malloc(S),*rb=malloc(S);memset(sb,1,S);
 struct fid_mr*mr1,*mr2;CK(fi_mr_reg(dom,sb,S,FI_SEND,0,2,0,&mr1,NULL));CK(fi_mr_reg(dom,rb,S,FI_RECV,0,1,0,&mr2,NULL));
 void*d1=fi_mr_desc(mr1),*d2=fi_mr_desc(mr2);
 size_t chunks[]={262144,1048576};int nm=4;double*t[4];for(int m=0;m<nm;m++)t[m]=calloc(iters,sizeof(double));
 for(int it=-3;it<iters;it++)for(int m=0;m<nm;m++){
  int two=m&1;size_t C=chunks[m>>1];if(C>S)C=S;struct fid_ep*rep=two?ep[1]:ep[0];fi_addr_t peer=two?pa[1]:pa[0];
  int n=(S+C-1)/C;int done=0;
  for(int k=0;k<n;k++){size_t len=S-k*C<C?S-k*C:C;while(fi_trecv(rep,rb+k*C,len,d2,FI_ADDR_UNSPEC,k,0,NULL)==-FI_EAGAIN)drain(&done);}
  MPI_Barrier(MPI_COMM_WORLD);double t0=MPI_Wtime();int sent=0;
  while(done<2*n){
   if(sent<n){size_t len=S-sent*C<C?S-sent*C:C;int r=fi_tsend(ep[0],sb+sent*C,len,d1,peer,sent,NULL);if(r==0)sent++;}
   drain(&done);
  }
  if(it>=0)t[m][it]=MPI_Wtime()-t0;}
 if(me==0)for(int m=0;m<nm;m++){qsort(t[m],iters,sizeof(double),cmp);double s=0;for(int i=0;i<iters;i++)s+=t[m][i];
  printf("S=%zu two=%d chunk=%zu: median %.1f us avg %.1f\n",S,m&1,chunks[m>>1],t[m][iters/2]*1e6,s/iters*1e6);}
 MPI_Finalize();return 0;}
