/* tcp_relay: the floor a user-space TCP proxy cannot go under, for scripts/bench-proxy.
 *
 * One thread, epoll, level-triggered: every accepted connection gets one upstream connection and
 * bytes are moved both ways without looking at them, either through a buffer (read + write, the
 * two kernel copies every proxy pays) or with splice() through a pipe (no copy to user space).
 * kmirrord does strictly more per byte (it frames and routes every Kafka request), so its CPU per
 * GB against this relay's, measured in the same run, is what its own work costs.
 *
 * Usage: tcp_relay LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT [copy|splice]
 * Not a test and not part of kmirror: a benchmark peer. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF_BYTES (256 * 1024)

/* One direction: bytes read from `from`, not yet written to `to`. */
struct half {
    int from, to;
    int pipe[2];   /* splice mode */
    char *buf;     /* copy mode */
    size_t len, off;
    struct half *peer;
    int closed;
    uint32_t armed; /* the events epoll has for `from` */
};

#define GONE ((struct half *)-1)

static int use_splice;
static int ep;

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* The events `fd` waits for: readable unless its direction has bytes pending, writable when the
 * other direction's bytes wait for it. */
static void arm(struct half *h)
{
    struct half *p = h->peer;
    struct epoll_event ev = { .events = 0, .data.ptr = h };
    if (h->len == 0 && !h->closed)
        ev.events |= EPOLLIN;
    if (p->len > 0)
        ev.events |= EPOLLOUT;
    if (ev.events == h->armed)
        return; /* no system call when nothing changes */
    h->armed = ev.events;
    if (epoll_ctl(ep, EPOLL_CTL_MOD, h->from, &ev) < 0)
        die("epoll_ctl");
}

static void close_pair(struct half *h)
{
    struct half *p = h->peer;
    close(h->from);
    close(p->from);
    if (use_splice) {
        close(h->pipe[0]); close(h->pipe[1]);
        close(p->pipe[0]); close(p->pipe[1]);
    }
    free(h->buf);
    free(p->buf);
    free(h < p ? h : p);
}

/* Writes what `h` holds to its destination; -1 on a dead connection. */
static int flush_half(struct half *h)
{
    while (h->len > 0) {
        ssize_t n = use_splice
            ? splice(h->pipe[0], NULL, h->to, NULL, h->len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
            : write(h->to, h->buf + h->off, h->len);
        if (n < 0)
            return errno == EAGAIN ? 0 : -1;
        h->len -= (size_t)n;
        h->off += (size_t)n;
    }
    h->off = 0;
    return 0;
}

/* Reads once from `h`'s source and writes on at once; -1 on end or error. */
static int pump(struct half *h)
{
    ssize_t n = use_splice
        ? splice(h->from, NULL, h->pipe[1], NULL, BUF_BYTES, SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
        : read(h->from, h->buf, BUF_BYTES);
    if (n == 0)
        return -1;
    if (n < 0)
        return errno == EAGAIN ? 0 : -1;
    h->len = (size_t)n;
    h->off = 0;
    return flush_half(h);
}

static int dial(const char *host, const char *port)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static void accept_one(int lfd, const char *host, const char *port)
{
    int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
    if (c < 0)
        return;
    int u = dial(host, port);
    if (u < 0) {
        close(c);
        return;
    }
    fcntl(u, F_SETFL, fcntl(u, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct half *pair = calloc(2, sizeof *pair);
    if (!pair)
        die("calloc");
    pair[0] = (struct half){ .from = c, .to = u, .peer = &pair[1] };
    pair[1] = (struct half){ .from = u, .to = c, .peer = &pair[0] };
    for (int i = 0; i < 2; i++) {
        if (use_splice) {
            if (pipe2(pair[i].pipe, O_NONBLOCK) < 0)
                die("pipe2");
            fcntl(pair[i].pipe[1], F_SETPIPE_SZ, BUF_BYTES);
        } else if (!(pair[i].buf = malloc(BUF_BYTES))) {
            die("malloc");
        }
        pair[i].armed = EPOLLIN;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &pair[i] };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, pair[i].from, &ev) < 0)
            die("epoll_ctl");
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT [copy|splice]\n", argv[0]);
        return 2;
    }
    use_splice = argc > 4 && strcmp(argv[4], "splice") == 0;
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 512) < 0)
        die("listen");
    if ((ep = epoll_create1(0)) < 0)
        die("epoll_create1");
    struct epoll_event lev = { .events = EPOLLIN, .data.ptr = NULL };
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            struct half *h = evs[i].data.ptr;
            if (h == GONE)
                continue;
            if (!h) {
                accept_one(lfd, argv[2], argv[3]);
                continue;
            }
            int bad = 0;
            if (evs[i].events & EPOLLOUT)
                bad = flush_half(h->peer) < 0;
            if (!bad && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && h->len == 0)
                bad = pump(h) < 0;
            if (bad) {
                /* The pair goes; other events for it in this batch must not be seen. */
                for (int j = i + 1; j < n; j++)
                    if (evs[j].data.ptr == h->peer || evs[j].data.ptr == h)
                        evs[j].data.ptr = GONE;
                close_pair(h);
                continue;
            }
            arm(h);
            arm(h->peer);
        }
    }
}
