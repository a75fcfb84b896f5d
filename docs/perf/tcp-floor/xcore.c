/* docs/perf/tcp-floor/xcore.c - the VM's two regimes (session 11, docs/PERF.md): how fast one
 * core hands 1 MB it just wrote to the other core (a thread on cpu0 writes, one on cpu1 reads, in
 * turn), and the same on one core. On the 2-vCPU CI-like VM the cross-core rate is ~7 GB/s in the
 * fast regime and ~2 GB/s in the slow one (the vCPUs' caches far apart), where DRAM still gives
 * ~10 GB/s: loopback TCP, whose kernel copies move every byte from one core's cache to the other's,
 * slows down with it.
 *   gcc -O2 -o xcore docs/perf/tcp-floor/xcore.c -lpthread && ./xcore 1000 5   (iterations, seconds) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define SZ (1<<20)
static char *buf; static _Atomic int turn; static int iters; static volatile long sink;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void *consumer(void*a){pin(1);long *p=(long*)buf;for(int i=0;i<iters;i++){while(atomic_load(&turn)!=1);long s=0;for(int j=0;j<SZ/8;j++)s+=p[j];sink+=s;atomic_store(&turn,0);}return a;}
int main(int argc,char**argv){buf=aligned_alloc(4096,SZ);memset(buf,1,SZ);iters=atoi(argv[1]);int secs=atoi(argv[2]);
 pin(0);for(int t=0;t<secs;t++){
  double t0=now();pthread_t th;atomic_store(&turn,0);pthread_create(&th,0,consumer,0);
  for(int i=0;i<iters;i++){while(atomic_load(&turn)!=0);memset(buf,i,SZ);atomic_store(&turn,1);}
  pthread_join(th,0);double x=now()-t0;
  double t1=now();long *p=(long*)buf;for(int i=0;i<iters;i++){memset(buf,i,SZ);long s=0;for(int j=0;j<SZ/8;j++)s+=p[j];sink+=s;}double y=now()-t1;
  printf("%.0f xcore %.2f GB/s  samecore %.2f GB/s\n",t0,(double)iters*SZ/x/1e9,(double)iters*SZ/y/1e9);fflush(stdout);}
}
