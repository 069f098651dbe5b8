/* copy_probe: what moving a mirror's bytes costs the kernel here, for docs/BENCHMARKS.md (issue 31, item 3).
 *
 * A sender process writes BYTES over loopback TCP to this process, which moves them to a sink
 * process over a second connection, the way kmirrord moves fetched batches into Produce requests.
 * Printed: the CPU seconds (user + system) of the moving process only. Modes:
 *   copy HELD_KIB    read() 256 KiB at a time into a ring, write() 64 KiB pieces HELD_KIB behind what
 *                    was read (a mirror holds a Fetch answer while it writes it: 10 MiB at P = 1)
 *   splice           splice() socket -> pipe -> socket, no copy to user space
 *   vmsplice         copy's reads, then each 64 KiB piece vmspliced into a pipe and spliced out
 *                    (the pages referenced, not copied, on the way out)
 *   batch            as a mirror would splice record batches: per 64 KiB batch its 61-byte header
 *                    read, its body spliced into a pipe and teed into a second one (kept for a
 *                    retry), a 100-byte request head and the header sent, the body spliced out,
 *                    the kept copy dropped once "acknowledged"
 * Usage: copy_probe copy HELD_KIB | splice | vmsplice | batch   [GIB, default 2]
 * Not a test and not part of kmirror: a benchmark probe. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define READ_BYTES (256 * 1024)
#define PIECE_BYTES (64 * 1024)
#define PIPE_BYTES (256 * 1024)

static int listener(struct sockaddr_in *a)
{
	socklen_t len = sizeof(*a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	*a = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (fd < 0 || bind(fd, (struct sockaddr *)a, sizeof(*a)) || getsockname(fd, (struct sockaddr *)a, &len) ||
	    listen(fd, 1)) {
		perror("listen");
		exit(1);
	}
	return fd;
}

static int dial(const struct sockaddr_in *a)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (const struct sockaddr *)a, sizeof(*a))) {
		perror("connect");
		exit(1);
	}
	return fd;
}

static void write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w <= 0) {
			perror("write");
			exit(1);
		}
		p += w;
		n -= (size_t)w;
	}
}

/* One piece out through the pipe: its pages referenced by the pipe, then spliced to the socket. */
static void vmsplice_out(int pipefd[2], int out, char *p, size_t n)
{
	struct iovec v = {p, n};
	while (v.iov_len) {
		ssize_t in = vmsplice(pipefd[1], &v, 1, 0), left;
		if (in <= 0) {
			perror("vmsplice");
			exit(1);
		}
		v.iov_base = (char *)v.iov_base + in;
		v.iov_len -= (size_t)in;
		for (left = in; left > 0;) {
			ssize_t o = splice(pipefd[0], NULL, out, NULL, (size_t)left, SPLICE_F_MOVE);
			if (o <= 0) {
				perror("splice");
				exit(1);
			}
			left -= o;
		}
	}
}

/* n bytes from a pipe (or socket) to a socket, a pipe or /dev/null. */
static void splice_all(int from, int to, size_t n, const char *what)
{
	while (n > 0) {
		ssize_t m = splice(from, NULL, to, NULL, n, SPLICE_F_MOVE);
		if (m <= 0) {
			perror(what);
			exit(1);
		}
		n -= (size_t)m;
	}
}

/* batch mode: total bytes moved a 64 KiB batch at a time; returns the bytes moved. */
static long long batch_move(int in, int out, int pipefd[2], long long total)
{
	enum { HEADER = 61, HEAD = 100 };
	int keep[2], devnull = open("/dev/null", O_WRONLY);
	char head[HEAD + HEADER];
	long long got = 0;

	if (devnull < 0 || pipe(keep)) {
		perror("pipe");
		exit(1);
	}
	(void)fcntl(keep[1], F_SETPIPE_SZ, PIPE_BYTES);
	memset(head, 0, sizeof(head));
	while (got < total) {
		size_t body = PIECE_BYTES - HEADER, h = 0;
		while (h < HEADER) {
			ssize_t r = recv(in, head + HEAD + h, HEADER - h, 0);
			if (r <= 0)
				return got;
			h += (size_t)r;
		}
		splice_all(in, pipefd[1], body, "splice in");
		for (size_t left = body; left > 0;) {
			ssize_t t = tee(pipefd[0], keep[1], left, 0);
			if (t <= 0) {
				perror("tee");
				exit(1);
			}
			left -= (size_t)t;
		}
		if (send(out, head, sizeof(head), MSG_MORE) != (ssize_t)sizeof(head)) {
			perror("send");
			exit(1);
		}
		splice_all(pipefd[0], out, body, "splice out");
		splice_all(keep[0], devnull, body, "drop");
		got += PIECE_BYTES;
	}
	return got;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	size_t held = strcmp(mode, "copy") == 0 && argc > 2 ? (size_t)atol(argv[2]) * 1024 : 0;
	int gib_arg = argc > (strcmp(mode, "copy") == 0 ? 3 : 2) ? atoi(argv[strcmp(mode, "copy") == 0 ? 3 : 2]) : 2;
	long long total = (long long)(gib_arg > 0 ? gib_arg : 2) << 30, got = 0, sent = 0;
	size_t ring = held + 2 * READ_BYTES + PIECE_BYTES;
	struct sockaddr_in src_a, dst_a;
	struct rusage r0, r1;
	int ls, ld, in, out, pipefd[2];
	char *buf;

	if (strcmp(mode, "copy") && strcmp(mode, "splice") && strcmp(mode, "vmsplice") && strcmp(mode, "batch")) {
		fprintf(stderr, "usage: copy_probe copy HELD_KIB | splice | vmsplice | batch [GIB]\n");
		return 2;
	}
	ls = listener(&src_a);
	ld = listener(&dst_a);
	if (fork() == 0) { /* the source */
		char *b = malloc(1 << 20);
		int fd = dial(&src_a);
		memset(b, 'm', 1 << 20);
		for (long long n = 0; n < total; n += 1 << 20)
			write_all(fd, b, 1 << 20);
		_exit(0);
	}
	if (fork() == 0) { /* the sink */
		char *b = malloc(1 << 20);
		int fd = accept(ld, NULL, NULL);
		while (read(fd, b, 1 << 20) > 0)
			;
		_exit(0);
	}
	in = accept(ls, NULL, NULL);
	out = dial(&dst_a);
	if (pipe(pipefd)) {
		perror("pipe");
		return 1;
	}
	(void)fcntl(pipefd[1], F_SETPIPE_SZ, PIPE_BYTES);
	buf = malloc(ring);
	memset(buf, 0, ring);
	getrusage(RUSAGE_SELF, &r0);
	if (!strcmp(mode, "batch"))
		got = batch_move(in, out, pipefd, total);
	while (got < total) {
		ssize_t n;
		if (!strcmp(mode, "splice")) {
			n = splice(in, NULL, pipefd[1], NULL, PIPE_BYTES, SPLICE_F_MOVE);
			if (n <= 0)
				break;
			got += n;
			for (ssize_t left = n; left > 0;) {
				ssize_t o = splice(pipefd[0], NULL, out, NULL, (size_t)left, SPLICE_F_MOVE);
				if (o <= 0) {
					perror("splice");
					return 1;
				}
				left -= o;
			}
			continue;
		}
		/* Into the ring at got, then the pieces that are `held` bytes behind out. */
		size_t at = (size_t)(got % (long long)ring), room = ring - at;
		n = read(in, buf + at, room < READ_BYTES ? room : READ_BYTES);
		if (n <= 0)
			break;
		got += n;
		while (got - sent >= (long long)(held + PIECE_BYTES) || (got == total && sent < got)) {
			size_t from = (size_t)(sent % (long long)ring), len = (size_t)(got - sent);
			if (len > PIECE_BYTES)
				len = PIECE_BYTES;
			if (len > ring - from)
				len = ring - from;
			if (!strcmp(mode, "vmsplice"))
				vmsplice_out(pipefd, out, buf + from, len);
			else
				write_all(out, buf + from, len);
			sent += (long long)len;
		}
	}
	getrusage(RUSAGE_SELF, &r1);
	close(out);
	while (wait(NULL) > 0)
		;
	printf("%s%s%s: %.2f GiB moved, %.3f CPU s per GiB\n", mode, held ? " held " : "",
	       held ? argv[2] : "", (double)got / (1 << 30),
	       ((double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) + (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) / 1e6 +
		(double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) + (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e6) /
		       ((double)got / (1 << 30)));
	return 0;
}
