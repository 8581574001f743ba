/*
 * One cache line bounced between two processes pinned to CPUs 0 and 1, once per fresh shared
 * mapping: shows whether the cost of moving a line between the cores depends on the mapping
 * (where the host put its pages) rather than on the program.
 *
 * usage: gcc -O2 -o mapping-pingpong tools/bench/mapping-pingpong.c && ./mapping-pingpong [MAPPINGS]
 * Prints the mean round trip (ns) for each mapping.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAP_BYTES (1 << 21)
#define ROUND_TRIPS 2000000L

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
        perror("sched_setaffinity");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int mappings = argc > 1 ? atoi(argv[1]) : 6;
    for (int m = 0; m < mappings; m++) {
        volatile uint64_t *p = mmap(NULL, MAP_BYTES, PROT_READ | PROT_WRITE,
                                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        p[0] = 0;  /* ping, written by the parent */
        p[16] = 0; /* pong, written by the child (another cache line) */
        pid_t child = fork();
        if (child < 0) {
            perror("fork");
            return 1;
        }
        if (child == 0) {
            pin(0);
            for (long i = 1; i <= ROUND_TRIPS; i++) {
                while (p[0] != (uint64_t)i) {
                }
                p[16] = i;
            }
            _exit(0);
        }
        pin(1);
        double t0 = now_ns();
        for (long i = 1; i <= ROUND_TRIPS; i++) {
            p[0] = i;
            while (p[16] != (uint64_t)i) {
            }
        }
        double t = now_ns() - t0;
        waitpid(child, NULL, 0);
        printf("mapping %d: %.1f ns per round trip\n", m, t / ROUND_TRIPS);
        munmap((void *)p, MAP_BYTES);
    }
    return 0;
}
