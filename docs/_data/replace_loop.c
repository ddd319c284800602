/* Replacing 1024 chunk files, with nothing else to do (docs/performance.md,
 * "Pinned writes: where the extra CPU went").
 *   gcc -O2 -o replace_loop replace_loop.c
 *   rm -rf DIR; taskset -c 0 ./replace_loop DIR MODE 1024 14000
 * MODE: rename (temporary file + rename, as zarr_fused and zarr's LocalStore
 * write), inplace (O_TRUNC + pwrite, as zarrs), tmpfile (O_TMPFILE + linkat,
 * with a rename where the name exists), create (O_EXCL to the final name). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <errno.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static double cpu(struct rusage*r,int sys){struct timeval v=sys?r->ru_stime:r->ru_utime; return v.tv_sec+v.tv_usec*1e-6;}
int main(int argc,char**argv){
  const char*dir=argv[1]; const char*mode=argv[2]; int n=atoi(argv[3]); int sz=atoi(argv[4]); int over=argc>5?atoi(argv[5]):0;
  char*buf=malloc(sz); for(int i=0;i<sz;i++) buf[i]=(char)(i*7);
  char path[4096],tmp[4096],pp[64];
  mkdir(dir,0777);
  if(over){ for(int i=0;i<n;i++){ snprintf(path,sizeof path,"%s/%d.%d",dir,i/32,i%32); int fd=open(path,O_WRONLY|O_CREAT|O_TRUNC,0666); write(fd,buf,sz); close(fd);} }
  struct rusage r0,r1; getrusage(RUSAGE_SELF,&r0); double t0=now();
  for(int i=0;i<n;i++){
    snprintf(path,sizeof path,"%s/%d.%d",dir,i/32,i%32);
    if(!strcmp(mode,"rename")){
      snprintf(tmp,sizeof tmp,"%s.%x-%d.partial",path,12345,i);
      int fd=open(tmp,O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC,0666); struct iovec v={buf,sz}; writev(fd,&v,1); close(fd);
      if(rename(tmp,path)) {perror("rename");return 1;}
    } else if(!strcmp(mode,"inplace")){
      int fd=open(path,O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC,0666); pwrite(fd,buf,sz,0); close(fd);
    } else if(!strcmp(mode,"inplace-notrunc")){
      int fd=open(path,O_WRONLY|O_CREAT|O_CLOEXEC,0666); pwrite(fd,buf,sz,0); ftruncate(fd,sz); close(fd);
    } else if(!strcmp(mode,"tmpfile")){
      int fd=open(dir,O_TMPFILE|O_WRONLY|O_CLOEXEC,0666); if(fd<0){perror("tmpfile");return 1;}
      write(fd,buf,sz); snprintf(pp,sizeof pp,"/proc/self/fd/%d",fd);
      if(linkat(AT_FDCWD,pp,AT_FDCWD,path,AT_SYMLINK_FOLLOW)){ if(errno!=EEXIST){perror("linkat");return 1;}
        snprintf(tmp,sizeof tmp,"%s.%d.partial",path,i); linkat(AT_FDCWD,pp,AT_FDCWD,tmp,AT_SYMLINK_FOLLOW); rename(tmp,path);} close(fd);
    } else if(!strcmp(mode,"create")){ /* O_EXCL straight to final name: lower bound */
      int fd=open(path,O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC,0666); write(fd,buf,sz); close(fd);
    }
  }
  double t1=now(); getrusage(RUSAGE_SELF,&r1);
  printf("%-16s over=%d n=%d wall %.4f user %.4f sys %.4f  per-file sys %.1f us\n",mode,over,n,t1-t0,cpu(&r1,0)-cpu(&r0,0),cpu(&r1,1)-cpu(&r0,1),(cpu(&r1,1)-cpu(&r0,1))/n*1e6);
  return 0;}
