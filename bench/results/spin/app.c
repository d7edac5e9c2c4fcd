#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int n = atoi(argv[2]);
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);
    char buf[512]; memset(buf, 'a', sizeof buf);
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) { if (write(fd, buf, 512) != 512) { perror("write"); return 1; } if (fdatasync(fd)) { perror("fdatasync"); return 1; } }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("%d ops in %.3f s: %.0f ops/s, %.1f us/op\n", n, s, n / s, s * 1e6 / n);
    return 0;
}
