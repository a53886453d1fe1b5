/* net_probe: small static network client the sandbox-network tests and the
 * net benchmark copy into busybox sandboxes (busybox's nc has no UDP and
 * no timing). Prints one line; exit 0 on success.
 *   net_probe udp ADDR PORT MESSAGE    one datagram from a connected socket:
 *                                      the answer, "timeout" (1 s, exit 1) or
 *                                      "refused" (ICMP unreachable, exit 2)
 *   net_probe connect ADDR PORT N      N TCP connects: "p50_us p99_us"
 *   net_probe get ADDR PORT PATH       one HTTP/1.0 GET: "bytes seconds"
 *   net_probe dns SERVER NAME N        N A queries, 32 in flight: "answers/s" */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static struct sockaddr_in addr_of(const char* a, const char* port) {
  struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(port))};
  if (inet_pton(AF_INET, a, &s.sin_addr) != 1) {
    fprintf(stderr, "net_probe: bad address %s\n", a);
    exit(64);
  }
  return s;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static int udp(struct sockaddr_in to, const char* msg) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*)&to, sizeof to) != 0) {
    printf("error %s\n", strerror(errno));
    return 2;
  }
  if (send(fd, msg, strlen(msg), 0) < 0) {
    printf("%s\n", errno == ECONNREFUSED ? "refused" : strerror(errno));
    return 2;
  }
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 1000) <= 0) {
    printf("timeout\n");
    return 1;
  }
  char buf[2048];
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  if (n < 0) {
    printf("%s\n", errno == ECONNREFUSED ? "refused" : strerror(errno));
    return 2;
  }
  printf("%.*s\n", (int)n, buf);
  return 0;
}

static int connects(struct sockaddr_in to, int n) {
  double* t = calloc((size_t)n, sizeof *t);
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    double t0 = now();
    if (connect(fd, (struct sockaddr*)&to, sizeof to) != 0) {
      printf("error %s\n", strerror(errno));
      return 2;
    }
    t[i] = (now() - t0) * 1e6;
    close(fd);
  }
  qsort(t, (size_t)n, sizeof *t, cmp);
  printf("%.1f %.1f\n", t[n / 2], t[n * 99 / 100]);
  return 0;
}

static int get(struct sockaddr_in to, const char* path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  double t0 = now();
  if (connect(fd, (struct sockaddr*)&to, sizeof to) != 0) {
    printf("error %s\n", strerror(errno));
    return 2;
  }
  char req[512];
  snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
  if (write(fd, req, strlen(req)) < 0) return 2;
  static char buf[1 << 16];
  long long total = 0;
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) total += n;
  if (n < 0) {
    printf("error %s\n", strerror(errno));
    return 2;
  }
  printf("%lld %.6f\n", total, now() - t0);
  return 0;
}

static int dns(struct sockaddr_in to, const char* name, int n) {
  /* A query for NAME, type A, class IN, id = the sequence number. */
  unsigned char q[300] = {0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  size_t len = 12;
  const char* p = name;
  while (*p) {
    const char* dot = strchr(p, '.');
    size_t l = dot ? (size_t)(dot - p) : strlen(p);
    q[len++] = (unsigned char)l;
    memcpy(q + len, p, l);
    len += l;
    p += l + (dot ? 1 : 0);
  }
  q[len++] = 0;
  q[len++] = 0, q[len++] = 1, q[len++] = 0, q[len++] = 1;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (connect(fd, (struct sockaddr*)&to, sizeof to) != 0) return 2;
  int sent = 0, answered = 0, in_flight = 0;
  double t0 = now();
  while (answered < n) {
    while (in_flight < 32 && sent < n) {
      q[0] = (unsigned char)(sent >> 8), q[1] = (unsigned char)sent;
      if (send(fd, q, len, 0) < 0) return 2;
      ++sent, ++in_flight;
    }
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 2000) <= 0) {
      in_flight = 0; /* lost ones: send more */
      if (sent >= n) break;
      continue;
    }
    unsigned char r[1500];
    if (recv(fd, r, sizeof r, 0) > 0) ++answered, --in_flight;
  }
  printf("%.0f\n", answered / (now() - t0));
  return answered == n ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 5 && !strcmp(argv[1], "udp")) return udp(addr_of(argv[2], argv[3]), argv[4]);
  if (argc == 5 && !strcmp(argv[1], "connect")) return connects(addr_of(argv[2], argv[3]), atoi(argv[4]));
  if (argc == 5 && !strcmp(argv[1], "get")) return get(addr_of(argv[2], argv[3]), argv[4]);
  if (argc == 5 && !strcmp(argv[1], "dns")) return dns(addr_of(argv[2], "53"), argv[3], atoi(argv[4]));
  fprintf(stderr, "usage: net_probe udp ADDR PORT MSG | connect ADDR PORT N | get ADDR PORT PATH | dns SERVER NAME N\n");
  return 64;
}
