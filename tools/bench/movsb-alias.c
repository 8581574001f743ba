/* rep movsb (and the C library's memcpy, which uses it for kilobytes) against the distance of
 * the destination from the source modulo 4 KiB: on this machine's AMD EPYC, distances of 1 to
 * 31 bytes run about twenty times slower. Used to explain ucs::memory::copy's aliased path.
 *
 *   gcc -O2 -o /tmp/movsb-alias tools/bench/movsb-alias.c
 *   taskset -c 1 /tmp/movsb-alias 8240      # rep movsb, GB/s per distance
 *   taskset -c 1 /tmp/movsb-alias 8240 m    # memcpy
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static void movsb(void *d, const void *s, size_t n){ asm volatile("rep movsb":"+D"(d),"+S"(s),"+c"(n)::"memory"); }
int main(int argc,char**argv){ char *src=aligned_alloc(4096, 1<<20), *dst=aligned_alloc(4096,1<<20); memset(src,1,1<<20); memset(dst,2,1<<20);
 size_t n = atoi(argv[1]); int use_memcpy = argc>2;
 for(int delta=-128; delta<=192; delta+=8){ int so = 1024, doff = 1024+delta; struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
  for(int k=0;k<100000;k++) { if(use_memcpy) memcpy(dst+doff+(k&7)*16384, src+so+(k&7)*16384, n); else movsb(dst+doff+(k&7)*16384, src+so+(k&7)*16384, n);} 
  clock_gettime(CLOCK_MONOTONIC,&b); double ns=(b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec);
  printf("%4d:%5.1f ", delta, 100000.0*n/ns); if (((delta+128)/8)%8==7) printf("\n"); }
 printf("\n");
}
