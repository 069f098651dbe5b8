/* Plain-socket bufferevents whose reads and writes are done here rather than by libevent's socket bufferevent. */
#define _GNU_SOURCE /* splice, F_SETPIPE_SZ */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "kmirror/net.h"
#include "net_int.h"

/*
 * Why: forwarding one message through libevent's socket bufferevent cost about nine system calls
 * (docs/net.md). Its read takes 4 KiB after a FIONREAD, then our fill read the rest; its deferred
 * callback costs a loop round; and each write arms the write event (epoll_ctl), waits a round for
 * it, writes, and disarms it (epoll_ctl). Here, once connected:
 * - the socket's read readiness is our own event: one recvmsg per readiness, into space sized
 *   by the previous read (recv_into), then the user's read callback, straight away;
 * - bytes added to the output activate a flush event of ours, which runs in the same loop round,
 *   after the callback that added them, and writes them with writev. Only when the socket is full
 *   is the bufferevent's own write event enabled; it finishes the output, and the write callback
 *   turns it off again once the output is empty.
 * The bufferevent stays what callers hold: input and output buffers, watermarks, connect, timeouts
 * while connecting, and its callbacks, which point at the trampolines below. So a bufferevent of
 * ours is recognised by its read callback, and its km_net_fast is the callback argument.
 */
typedef struct km_net_fast {
	struct bufferevent *bev;
	struct event *rd;    /* the socket's read readiness, once connected */
	struct event *flush; /* activated when the output grows */
	struct evbuffer_cb_entry *out_cb;
	bufferevent_data_cb readcb, writecb;
	bufferevent_event_cb eventcb;
	void *arg;
	size_t read_max;  /* the input is read up to this size per readiness event */
	size_t guess;     /* what a read reserves in the input: from the sizes of the last ones (read_ready) */
	bool fast;        /* connected: reads and writes are ours */
	bool want_read;   /* the caller has reading enabled */
	bool slow_write;  /* the socket was full: the bufferevent's write event finishes the output */
	bool flush_armed; /* the flush event is active */
	bool dead;        /* freed by the caller inside one of its callbacks; released when that returns */
	int depth;        /* callbacks of the caller running from here */
	/* A spliced range out of this socket (docs/net.md, "Spliced ranges"): its destination, NULL when none. */
	struct km_net_fast *sp_dst;
	size_t sp_left;  /* bytes of the range still in this socket */
	size_t sp_piped; /* bytes of the range in the pipe */
	bufferevent_data_cb sp_done;
	void *sp_arg;
	int pipe[2]; /* opened at the first range, kept until freed; -1 when none */
	size_t pipe_cap;
	/* A range into this socket: its source, and the output's bytes that go before it. */
	struct km_net_fast *sp_src;
	size_t out_before;
	struct event *wr; /* this socket's write readiness while a range goes into it */
} km_net_fast;

#define READ_MIN 4096
#define READ_DEFAULT (256 * 1024)
/* The least a read reserves: with its header, libevent's smallest chain (1 KiB). */
#define READ_GUESS_MIN 512
/* A read's bytes past its reservation, copied into the input after it. */
#define SPILL_BYTES (256 * 1024)
/* A range's pipe: as large as one read of ours (the default pipe is 64 KiB). */
#define PIPE_BYTES (256 * 1024)
/* What one readiness takes into the pipe at most: a fast range does not hold the loop from the others. */
#define SPLICE_ROUND_BYTES (1024 * 1024)

static void tramp_read(struct bufferevent *bev, void *arg);

static km_net_fast *fast_of(struct bufferevent *bev)
{
	bufferevent_data_cb rd = NULL;
	void *arg = NULL;
	bufferevent_getcb(bev, &rd, NULL, NULL, &arg);
	return rd == tramp_read ? arg : NULL;
}

static void pipe_close(km_net_fast *f)
{
	if (f->pipe[0] >= 0) {
		close(f->pipe[0]);
		close(f->pipe[1]);
	}
	f->pipe[0] = f->pipe[1] = -1;
}

static void release(km_net_fast *f)
{
	if (f->rd)
		event_free(f->rd);
	if (f->flush)
		event_free(f->flush);
	if (f->wr)
		event_free(f->wr);
	pipe_close(f);
	free(f);
}

/* After one of the caller's callbacks: false when the caller freed the bufferevent in it. */
static bool returned(km_net_fast *f)
{
	f->depth--;
	if (f->dead) {
		if (!f->depth)
			release(f);
		return false;
	}
	return true;
}

/* Runs one of the caller's callbacks; false when the caller freed the bufferevent in it. */
static bool call_data(km_net_fast *f, bufferevent_data_cb cb)
{
	if (!cb)
		return true;
	f->depth++;
	cb(f->bev, f->arg);
	return returned(f);
}

static bool call_event(km_net_fast *f, short what)
{
	if (!f->eventcb)
		return true;
	f->depth++;
	f->eventcb(f->bev, what, f->arg);
	return returned(f);
}

static void arm_flush(km_net_fast *f)
{
	if (f->fast && !f->slow_write && !f->flush_armed) {
		f->flush_armed = true;
		event_active(f->flush, EV_WRITE, 1);
	}
}

static void out_changed(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	(void)buf;
	if (info->n_added)
		arm_flush(arg);
}

/* ---- spliced ranges: socket -> pipe -> socket, in order with the destination's output ---- */

/* The range's state cleared on both sides; s reads again as its caller wants, d flushes what waited. */
static void sp_end(km_net_fast *s)
{
	km_net_fast *d = s->sp_dst;

	s->sp_dst = NULL;
	s->sp_left = 0;
	if (s->sp_piped)
		pipe_close(s); /* bytes of a range that failed: the next range gets a new pipe */
	s->sp_piped = 0;
	if (s->want_read)
		event_add(s->rd, NULL);
	else
		event_del(s->rd);
	if (d) {
		d->sp_src = NULL;
		d->out_before = 0;
		event_del(d->wr);
		if (evbuffer_get_length(bufferevent_get_output(d->bev)))
			arm_flush(d);
	}
}

/* A callback of the caller's, with both sides held: freeing either inside it releases it afterwards. */
static void sp_call(km_net_fast *s, km_net_fast *d, km_net_fast *who, short what)
{
	s->depth++;
	d->depth++;
	if (what)
		call_event(who, what);
	else if (s->sp_done)
		s->sp_done(s->bev, s->sp_arg);
	returned(s);
	returned(d);
}

/* What one write into the range's destination socket did (n: its return, errno as it left it). */
typedef enum { SP_WROTE, SP_AGAIN, SP_FULL, SP_FAILED } sp_write;

static sp_write sp_wrote(ssize_t n, size_t *left)
{
	if (n > 0) {
		*left -= (size_t)n;
		return SP_WROTE;
	}
	if (n < 0 && errno == EINTR)
		return SP_AGAIN;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return SP_FULL;
	return SP_FAILED;
}

/*
 * Moves what can be moved of s's range now: d's output that went before it, the pipe into d's
 * socket, s's socket into the pipe; until nothing moves. Then waits: for d's socket to take more
 * (d->wr) when it is full, for s's socket to bring more (s->rd) only when the pipe is empty, so a
 * full pipe (splice says EAGAIN for it as for an empty socket) never spins the loop. One call takes
 * at most SPLICE_ROUND_BYTES from s's socket; the rest comes at its next readiness.
 */
static void sp_run(km_net_fast *s)
{
	km_net_fast *d = s->sp_dst;
	evutil_socket_t sfd = bufferevent_getfd(s->bev), dfd = bufferevent_getfd(d->bev);
	struct evbuffer *out = bufferevent_get_output(d->bev);
	bool blocked = false;
	size_t taken = 0;
	ssize_t n;

	for (;;) {
		bool moved = false;
		sp_write w;

		blocked = false;
		if (d->out_before) {
			evbuffer_unfreeze(out, 1);
			n = evbuffer_write_atmost(out, dfd, (ev_ssize_t)d->out_before);
			evbuffer_freeze(out, 1);
			if ((w = sp_wrote(n, &d->out_before)) == SP_AGAIN)
				continue;
			if (w == SP_FAILED)
				goto write_failed;
			moved |= w == SP_WROTE;
			blocked |= w == SP_FULL;
		}
		if (!d->out_before && s->sp_piped) {
			n = splice(s->pipe[0], NULL, dfd, NULL, s->sp_piped, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
			if ((w = sp_wrote(n, &s->sp_piped)) == SP_AGAIN)
				continue;
			if (w == SP_FAILED)
				goto write_failed;
			moved |= w == SP_WROTE;
			blocked |= w == SP_FULL;
		}
		if (s->sp_left && s->sp_piped < s->pipe_cap && taken < SPLICE_ROUND_BYTES) {
			size_t want = s->pipe_cap - s->sp_piped;
			n = splice(sfd, NULL, s->pipe[1], NULL, want < s->sp_left ? want : s->sp_left,
				   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
			if (n > 0) {
				s->sp_left -= (size_t)n;
				s->sp_piped += (size_t)n;
				taken += (size_t)n;
				moved = true;
			} else if (n < 0 && errno == EINTR) {
				continue;
			} else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
				/* End of stream or an error inside the range: the caller hears of it as from a read. */
				short what = (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR));
				s->want_read = false;
				sp_end(s);
				sp_call(s, d, s, what);
				return;
			}
		}
		if (!s->sp_left && !s->sp_piped && !d->out_before) {
			sp_end(s);
			sp_call(s, d, s, 0);
			return;
		}
		if (!moved)
			break;
	}
	if (blocked)
		event_add(d->wr, NULL);
	if (s->sp_left && !s->sp_piped)
		event_add(s->rd, NULL);
	else
		event_del(s->rd);
	return;
write_failed:
	/* As a failed flush: the destination's caller hears of it. */
	event_del(d->rd);
	d->want_read = false;
	sp_end(s);
	sp_call(s, d, d, BEV_EVENT_WRITING | BEV_EVENT_ERROR);
}

/* d's socket can take more of the range going into it. */
static void sp_writable(evutil_socket_t fd, short what, void *arg)
{
	km_net_fast *d = arg;
	(void)fd;
	(void)what;
	if (d->sp_src)
		sp_run(d->sp_src);
}

static bool pipe_open(km_net_fast *f)
{
	int sz;
	if (pipe2(f->pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
		f->pipe[0] = f->pipe[1] = -1;
		return false;
	}
	(void)fcntl(f->pipe[1], F_SETPIPE_SZ, PIPE_BYTES); /* past pipe-max-size: the default size stays */
	sz = fcntl(f->pipe[1], F_GETPIPE_SZ);
	f->pipe_cap = sz > 0 ? (size_t)sz : 65536;
	return true;
}

static void flush_cb(evutil_socket_t unused, short what, void *arg)
{
	km_net_fast *f = arg;
	struct evbuffer *out = bufferevent_get_output(f->bev);
	evutil_socket_t fd = bufferevent_getfd(f->bev);

	(void)unused;
	(void)what;
	f->flush_armed = false;
	if (f->sp_src) {
		sp_run(f->sp_src); /* a range goes into this socket: its output waits its turn */
		return;
	}
	if (!f->fast || f->slow_write)
		return;
	/* A socket bufferevent keeps its output's start frozen except while it writes itself. */
	evbuffer_unfreeze(out, 1);
	while (evbuffer_get_length(out)) {
		int n;
		errno = 0;
		n = evbuffer_write(out, fd);
		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		/* As the bufferevent would: reading and writing stop, the caller hears of it. */
		evbuffer_freeze(out, 1);
		event_del(f->rd);
		f->want_read = false;
		call_event(f, BEV_EVENT_WRITING | BEV_EVENT_ERROR);
		return;
	}
	evbuffer_freeze(out, 1);
	if (evbuffer_get_length(out)) {
		f->slow_write = true;
		bufferevent_enable(f->bev, EV_WRITE);
		return;
	}
	call_data(f, f->writecb); /* the output is empty: at or below any low watermark */
}

/*
 * Bytes of a read past its reservation land here and are copied into the input: one per thread
 * (one event base per thread), touched only by reads that outgrow their reservation.
 */
static _Thread_local uint8_t spill[SPILL_BYTES];

/*
 * One recvmsg of up to want bytes into in: into space reserved at in's end for about guess bytes
 * (what libevent offers for it, a chain rounded up to a power of two), the rest into spill and
 * copied after it. So a read reserves what the previous one brought, not what it may bring: a
 * consumer that moves chains out takes their free space too, and a slow peer's trickle must not
 * leave a 256 KiB chain per read behind it; and no FIONREAD is needed to know what the socket
 * holds. Returns the bytes read, 0 at EOF, -1 (errno) on error.
 */
static ssize_t recv_into(struct evbuffer *in, int fd, size_t want, size_t guess)
{
	struct evbuffer_iovec v[5];
	struct msghdr mh;
	size_t left = want, got, over = 0;
	int nv, nr;
	ssize_t rc;

	/* A socket bufferevent keeps its input's end frozen except while it reads itself. */
	evbuffer_unfreeze(in, 0);
	nr = evbuffer_reserve_space(in, (ev_ssize_t)(guess < want ? guess : want), v, 4);
	if (nr <= 0) {
		evbuffer_freeze(in, 0);
		errno = ENOMEM;
		return -1;
	}
	for (int i = 0; i < nr; i++) {
		if (v[i].iov_len > left)
			v[i].iov_len = left;
		left -= v[i].iov_len;
	}
	nv = nr;
	if (left) {
		v[nv].iov_base = spill;
		v[nv].iov_len = left < sizeof(spill) ? left : sizeof(spill);
		nv++;
	}
	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = (struct iovec *)v;
	mh.msg_iovlen = (size_t)nv;
	rc = recvmsg(fd, &mh, MSG_DONTWAIT);
	if (rc <= 0) {
		int e = errno;
		evbuffer_commit_space(in, v, 0);
		evbuffer_freeze(in, 0);
		errno = e;
		return rc;
	}
	got = (size_t)rc;
	for (int i = 0; i < nr; i++) {
		if (v[i].iov_len > got)
			v[i].iov_len = got;
		got -= v[i].iov_len;
	}
	over = got; /* what went past the reservation, into spill */
	while (nr > 0 && v[nr - 1].iov_len == 0)
		nr--;
	evbuffer_commit_space(in, v, nr);
	if (over && evbuffer_add(in, spill, over) != 0) {
		evbuffer_freeze(in, 0);
		errno = ENOMEM;
		return -1;
	}
	evbuffer_freeze(in, 0);
	return rc;
}

static void read_ready(evutil_socket_t fd, short what, void *arg)
{
	km_net_fast *f = arg;
	struct evbuffer *in = bufferevent_get_input(f->bev);
	size_t have = evbuffer_get_length(in), want = f->read_max > have ? f->read_max - have : 0;
	ssize_t rc;

	(void)what;
	if (f->sp_dst) {
		sp_run(f); /* a range is moving out of this socket: nothing is read into the input */
		return;
	}
	if (want < READ_MIN)
		want = READ_MIN;
	rc = recv_into(in, fd, want, f->guess);
	if (rc > 0) {
		/*
		 * Up at once with a larger read; down by half only when the socket had less than asked
		 * (a read cut at want, such as the proxy's 4 KiB peeks, says nothing of what waits).
		 */
		if ((size_t)rc >= want)
			f->guess = (size_t)rc > f->guess ? (size_t)rc : f->guess;
		else
			f->guess = (size_t)rc > f->guess / 2 ? (size_t)rc : f->guess / 2;
		if (f->guess < READ_GUESS_MIN)
			f->guess = READ_GUESS_MIN;
		call_data(f, f->readcb);
		return;
	}
	if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	event_del(f->rd);
	f->want_read = false;
	call_event(f, (short)(BEV_EVENT_READING | (rc == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)));
}

/* Connected (or accepted): reading and writing become ours. */
static void go_fast(km_net_fast *f)
{
	struct evbuffer *out = bufferevent_get_output(f->bev);

	if (f->fast)
		return;
	/* Listeners and connects give non-blocking sockets; make sure, since a blocking write would stall the loop. */
	evutil_make_socket_nonblocking(bufferevent_getfd(f->bev));
	f->rd = event_new(bufferevent_get_base(f->bev), bufferevent_getfd(f->bev), EV_READ | EV_PERSIST, read_ready, f);
	if (!f->rd)
		return; /* out of memory: the bufferevent goes on doing its own I/O */
	bufferevent_disable(f->bev, EV_READ | EV_WRITE);
	f->fast = true;
	if (f->want_read)
		event_add(f->rd, NULL);
	if (evbuffer_get_length(out))
		arm_flush(f);
}

static void tramp_read(struct bufferevent *bev, void *arg)
{
	km_net_fast *f = arg;
	(void)bev;
	call_data(f, f->readcb);
}

static void tramp_write(struct bufferevent *bev, void *arg)
{
	km_net_fast *f = arg;
	if (f->slow_write && evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
		bufferevent_disable(bev, EV_WRITE);
		f->slow_write = false;
	}
	call_data(f, f->writecb);
}

static void tramp_event(struct bufferevent *bev, short what, void *arg)
{
	km_net_fast *f = arg;
	(void)bev;
	if (what & BEV_EVENT_CONNECTED)
		go_fast(f);
	call_event(f, what);
}

struct bufferevent *km_net_bev_plain_new(struct event_base *base, int fd, int opts)
{
	struct bufferevent *bev = bufferevent_socket_new(base, fd, opts);
	km_net_fast *f;

	if (!bev)
		return NULL;
	f = calloc(1, sizeof(*f));
	if (f) {
		f->bev = bev;
		f->read_max = READ_DEFAULT;
		f->guess = READ_MIN;
		f->pipe[0] = f->pipe[1] = -1;
		f->flush = event_new(base, -1, 0, flush_cb, f);
		f->out_cb = evbuffer_add_cb(bufferevent_get_output(bev), out_changed, f);
	}
	if (!f || !f->flush || !f->out_cb) {
		if (f)
			release(f);
		bufferevent_free(bev);
		return NULL;
	}
	bufferevent_setcb(bev, tramp_read, tramp_write, tramp_event, f);
	if (fd >= 0)
		go_fast(f);
	return bev;
}

void km_net_bev_plain_fill(struct bufferevent *bev, size_t upto)
{
	km_net_fast *f = fast_of(bev);
	if (f)
		f->read_max = upto > READ_MIN ? upto : READ_MIN;
}

void km_net_bev_setcb(struct bufferevent *bev, bufferevent_data_cb readcb, bufferevent_data_cb writecb,
		      bufferevent_event_cb eventcb, void *arg)
{
	km_net_fast *f = fast_of(bev);
	if (!f) {
		bufferevent_setcb(bev, readcb, writecb, eventcb, arg);
		return;
	}
	f->readcb = readcb;
	f->writecb = writecb;
	f->eventcb = eventcb;
	f->arg = arg;
}

void km_net_bev_enable(struct bufferevent *bev, short what)
{
	km_net_fast *f = fast_of(bev);
	if (!f) {
		bufferevent_enable(bev, what);
		return;
	}
	if (what & EV_READ)
		f->want_read = true;
	if (!f->fast)
		bufferevent_enable(bev, what); /* connecting: the bufferevent's own events do the connect */
	else if ((what & EV_READ) && !f->sp_dst)
		event_add(f->rd, NULL); /* during a range, reading follows the range; want_read is for after it */
}

void km_net_bev_disable(struct bufferevent *bev, short what)
{
	km_net_fast *f = fast_of(bev);
	if (!f) {
		bufferevent_disable(bev, what);
		return;
	}
	if (what & EV_READ)
		f->want_read = false;
	if (!f->fast)
		bufferevent_disable(bev, what);
	else if ((what & EV_READ) && !f->sp_dst)
		event_del(f->rd);
}

void km_net_bev_free(struct bufferevent *bev)
{
	km_net_fast *f = fast_of(bev);
	if (f) {
		/* A range of either side ends with it; the other side goes on as if it had not started. */
		if (f->sp_dst)
			sp_end(f);
		if (f->sp_src)
			sp_end(f->sp_src);
		evbuffer_remove_cb_entry(bufferevent_get_output(bev), f->out_cb);
		if (f->rd)
			event_del(f->rd);
		event_del(f->flush);
		if (f->wr)
			event_del(f->wr);
		pipe_close(f);
		f->bev = NULL;
		if (f->depth)
			f->dead = true;
		else
			release(f);
	}
	bufferevent_free(bev);
}

bool km_net_bev_can_splice(struct bufferevent *bev)
{
	km_net_fast *f = fast_of(bev);
	return f && f->fast && !f->sp_dst && !f->sp_src;
}

int km_net_bev_splice(struct bufferevent *src, struct bufferevent *dst, size_t n, bufferevent_data_cb done, void *arg)
{
	km_net_fast *s = fast_of(src), *d = fast_of(dst);
	struct evbuffer *in, *out;
	size_t have;

	if (!s || !d || s == d || !s->fast || !d->fast || s->sp_dst || s->sp_src || d->sp_dst || d->sp_src)
		return KM_ERR_INVAL;
	in = bufferevent_get_input(src);
	out = bufferevent_get_output(dst);
	have = evbuffer_get_length(in);
	if (have >= n) {
		evbuffer_remove_buffer(in, out, n);
		return 1;
	}
	if (s->pipe[0] < 0 && !pipe_open(s))
		return KM_ERR_IO;
	if (!d->wr && !(d->wr = event_new(bufferevent_get_base(dst), bufferevent_getfd(dst), EV_WRITE, sp_writable, d)))
		return KM_ERR_NOMEM;
	evbuffer_remove_buffer(in, out, have);
	/* Everything the output holds now goes before the range; what is added later, after it. */
	d->out_before = evbuffer_get_length(out);
	if (d->slow_write) {
		/* The bufferevent's own write would not stop at the range: ours finishes the output. */
		bufferevent_disable(dst, EV_WRITE);
		d->slow_write = false;
	}
	s->sp_dst = d;
	d->sp_src = s;
	s->sp_left = n - have;
	s->sp_piped = 0;
	s->sp_done = done;
	s->sp_arg = arg;
	event_active(s->rd, EV_READ, 1); /* the range starts from the loop, never inside the caller */
	return 0;
}

/* ---- moving bytes between buffers without copying them ---- */

/* A chain shared by what moves and what stays is referenced from this many bytes on (less is copied). */
#define MOVE_REF_MIN 2048
/* Nor when the source holds more chains than this: each would get a reference chain of its own. */
#define MOVE_REF_CHAINS 4

static void unpin(const void *data, size_t len, void *arg)
{
	(void)data;
	(void)len;
	evbuffer_free(arg);
}

/*
 * libevent's evbuffer_remove_buffer moves whole chains but copies the part of a chain it takes
 * only partly, which is most of a request whose read also brought the start of the next one. Here
 * that part is referenced instead: a buffer of ours takes a reference to src's chains (libevent
 * keeps a referenced chain's memory and makes it immutable until the last reference goes), and
 * dst gets the part as a reference whose release frees that buffer.
 */
void km_net_move(struct evbuffer *src, struct evbuffer *dst, size_t n)
{
	struct evbuffer_iovec v[MOVE_REF_CHAINS];
	struct evbuffer *pin;
	size_t sum = 0, part;
	int nv = evbuffer_peek(src, (ev_ssize_t)n, NULL, v, MOVE_REF_CHAINS);

	/* (peek with a length counts every chain up to it; with -1 it would stop at the array's end) */
	if (nv <= 0 || nv > MOVE_REF_CHAINS ||
	    evbuffer_peek(src, (ev_ssize_t)evbuffer_get_length(src), NULL, NULL, 0) > MOVE_REF_CHAINS)
		goto copy;
	for (int i = 0; i < nv; i++)
		sum += v[i].iov_len;
	if (sum <= n)
		goto copy; /* n ends with a chain: nothing is copied */
	part = v[nv - 1].iov_len - (sum - n);
	if (part < MOVE_REF_MIN)
		goto copy;
	if (!(pin = evbuffer_new()))
		goto copy;
	evbuffer_remove_buffer(src, dst, n - part); /* the whole chains before it */
	if (evbuffer_add_buffer_reference(pin, src) != 0 || evbuffer_get_length(pin) != evbuffer_get_length(src) ||
	    evbuffer_add_reference(dst, v[nv - 1].iov_base, part, unpin, pin) != 0) {
		evbuffer_free(pin);
		n = part;
		goto copy;
	}
	evbuffer_drain(src, part);
	return;
copy:
	evbuffer_remove_buffer(src, dst, n);
}
