/* Calling a Kafka API by key: the version picker, encode/decode through the API table, one retry policy (docs/net.md). */
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "kmirror/api.h"
#include "kmirror/codec.h"
#include "kmirror/rpc.h"
#include "net_int.h"

#define BACKOFF_DEFAULT_MS 100
#define BACKOFF_MAX_DEFAULT_MS 1000

/* One call: its encoded body kept for resends, and its place on the client's list while a resend waits. */
struct km_net_rpc {
	km_net_client *c;
	const km_api_info *api;
	int16_t version;
	uint8_t *body;
	size_t len;
	km_rpc_opts opts;
	bool has_opts;
	km_rpc_cb cb;
	void *arg;
	unsigned attempts;
	int64_t first_ms;
	struct event *timer;
	km_net_rpc *prev, *next; /* on the client's waiting list, while the timer runs */
	char why[256];
};

int16_t km_net_version_pick(const km_net_client *c, int16_t api_key, int16_t lo, int16_t hi)
{
	int16_t v = km_net_client_version(c, api_key);
	if (v < 0 || v < lo)
		return -1;
	return v > hi ? hi : v;
}

km_rpc_action km_rpc_classify(km_err err)
{
	switch (err) {
	case KM_OK:
		return KM_RPC_DONE;
	/* Metadata is stale: the leader or coordinator is elsewhere now (the Java client's InvalidMetadataException). */
	case 3:  /* UNKNOWN_TOPIC_OR_PARTITION */
	case 5:  /* LEADER_NOT_AVAILABLE */
	case 6:  /* NOT_LEADER_OR_FOLLOWER */
	case 15: /* COORDINATOR_NOT_AVAILABLE */
	case 16: /* NOT_COORDINATOR */
	case 41: /* NOT_CONTROLLER */
	case 74: /* FENCED_LEADER_EPOCH */
	case 75: /* UNKNOWN_LEADER_EPOCH */
	/* The connection is gone: the request must go to a new one. */
	case KM_ERR_CLOSED:
	case KM_ERR_IO:
	case KM_ERR_TIMEOUT:
	case KM_ERR_TLS:
		return KM_RPC_REFRESH;
	case KM_ERR_FULL:
	case KM_ERR_NOMEM:
		return KM_RPC_RETRY;
	default:
		return err > 0 && km_err_retriable(err) ? KM_RPC_RETRY : KM_RPC_DONE;
	}
}

const char *km_rpc_action_name(km_rpc_action a)
{
	static const char *const names[] = {"done", "retry", "refresh"};
	return (unsigned)a < sizeof(names) / sizeof(names[0]) ? names[a] : "?";
}

int64_t km_rpc_backoff_ms(unsigned attempt, int64_t base_ms, int64_t max_ms)
{
	int64_t d = base_ms > 0 ? base_ms : BACKOFF_DEFAULT_MS, cap = max_ms > 0 ? max_ms : BACKOFF_MAX_DEFAULT_MS;
	int64_t j;

	for (unsigned i = 1; i < attempt && d < cap; i++)
		d *= 2;
	if (d > cap)
		d = cap;
	j = d / 5; /* +-20%, so that many callers retrying together spread out */
	if (j > 0)
		d += (int64_t)(random() % (2 * j + 1)) - j;
	return d > 0 ? d : 1;
}

static int64_t now_ms(km_net_client *c)
{
	struct timeval tv;
	event_base_gettimeofday_cached(km_net_client_base(c), &tv);
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void call_free(km_net_rpc *x)
{
	if (x->timer)
		event_free(x->timer);
	free(x->body);
	free(x);
}

static void deliver(km_net_rpc *x, km_net_client *c, km_rpc_response *r)
{
	if (r->err != KM_OK)
		r->action = km_rpc_classify(r->err);
	r->api_key = x->api->api_key;
	r->version = x->version;
	r->attempts = x->attempts;
	if (!r->why)
		r->why = "";
	x->cb(c, r, x->arg);
}

static km_err send_once(km_net_rpc *x);

static void unlink_waiting(km_net_rpc *x)
{
	km_net_rpc **head = km_net_client_rpc_waiting(x->c);
	if (x->prev)
		x->prev->next = x->next;
	else if (*head == x)
		*head = x->next;
	if (x->next)
		x->next->prev = x->prev;
	x->prev = x->next = NULL;
}

static void on_resend(evutil_socket_t fd, short what, void *arg)
{
	km_net_rpc *x = arg;
	km_err rc;
	(void)fd;
	(void)what;
	unlink_waiting(x);
	if ((rc = send_once(x)) != KM_OK) {
		km_rpc_response r = {.err = rc};
		deliver(x, x->c, &r);
		call_free(x);
	}
}

/* Whether a response whose own code says retry is sent again; if so the timer is armed. */
static bool resend_later(km_net_rpc *x, km_err code)
{
	int64_t delay, now;
	struct timeval tv;
	km_net_rpc **head;

	if (!x->has_opts || !x->opts.error_of || x->opts.retry_budget_ms <= 0 || km_rpc_classify(code) != KM_RPC_RETRY)
		return false;
	delay = km_rpc_backoff_ms(x->attempts, x->opts.backoff_ms, x->opts.backoff_max_ms);
	now = now_ms(x->c);
	if (now + delay > x->first_ms + x->opts.retry_budget_ms)
		return false;
	if (!x->timer && !(x->timer = evtimer_new(km_net_client_base(x->c), on_resend, x)))
		return false;
	tv.tv_sec = delay / 1000;
	tv.tv_usec = (delay % 1000) * 1000;
	if (evtimer_add(x->timer, &tv) != 0)
		return false;
	head = km_net_client_rpc_waiting(x->c);
	x->next = *head;
	if (*head)
		(*head)->prev = x;
	*head = x;
	return true;
}

/* Decode body into a (body first copied into a when the caller keeps the arena). */
static km_err decode(km_net_rpc *x, const uint8_t *body, size_t len, km_arena *a, void **msg)
{
	const km_api_codec *codec = &x->api->response;
	km_rd rd;
	km_err rc;

	if (x->has_opts && x->opts.arena && len) {
		uint8_t *copy = km_arena_alloc(a, len);
		if (!copy)
			return km_arena_err(a);
		memcpy(copy, body, len);
		body = copy;
	}
	if (!(*msg = km_arena_calloc(a, codec->struct_size)))
		return km_arena_err(a);
	codec->init(*msg);
	km_rd_init(&rd, body, len);
	if ((rc = codec->decode(&rd, x->version, *msg, a)) != KM_OK) {
		km_codec_strerror(x->why, sizeof(x->why), x->api->api_key, x->version, &rd);
		*msg = NULL;
	}
	return rc;
}

static void on_flat(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	km_net_rpc *x = arg;
	km_arena own, *a = x->has_opts && x->opts.arena ? x->opts.arena : &own;
	km_rpc_response r = {.err = err, .arena = a};

	if (a == &own)
		km_arena_init(&own, x->has_opts ? x->opts.arena_cap : 0);
	if (err == KM_OK && (r.err = decode(x, body, len, a, &r.msg)) == KM_OK) {
		r.code = x->has_opts && x->opts.error_of ? x->opts.error_of(r.msg) : KM_OK;
		r.action = km_rpc_classify(r.code);
		if (r.code != KM_OK && resend_later(x, r.code)) {
			if (a == &own)
				km_arena_free(&own);
			return;
		}
	}
	if (r.err == KM_ERR_DECODE)
		r.why = x->why;
	deliver(x, c, &r);
	if (a == &own)
		km_arena_free(&own);
	call_free(x);
}

static km_err send_once(km_net_rpc *x)
{
	km_net_request rq;
	km_net_piece pc = {.p = x->body, .len = x->len};

	km_net_request_init(&rq, x->api->api_key, x->version);
	rq.pieces = &pc;
	rq.npieces = 1;
	rq.delivery = KM_NET_FLAT;
	rq.on_flat = on_flat;
	rq.arg = x;
	x->attempts++;
	return km_net_client_request(x->c, &rq);
}

km_err km_rpc_call_raw(km_net_client *c, int16_t api_key, int16_t version, const uint8_t *body, size_t len,
		       const km_rpc_opts *opts, km_rpc_cb cb, void *arg)
{
	const km_api_info *api = km_api_lookup(api_key);
	km_net_rpc *x;
	km_err rc;

	if (!api || !km_api_version_supported(api_key, version))
		return KM_ERR_UNSUPPORTED;
	if (!cb || !c)
		return KM_ERR_INVAL;
	if (!(x = calloc(1, sizeof(*x))))
		return KM_ERR_NOMEM;
	*x = (km_net_rpc){.c = c, .api = api, .version = version, .len = len, .cb = cb, .arg = arg};
	if (!(x->body = malloc(len ? len : 1))) {
		free(x);
		return KM_ERR_NOMEM;
	}
	memcpy(x->body, body, len);
	if (opts) {
		x->opts = *opts;
		x->has_opts = true;
	}
	x->first_ms = now_ms(c);
	if ((rc = send_once(x)) != KM_OK)
		call_free(x);
	return rc;
}

km_err km_rpc_call(km_net_client *c, int16_t api_key, int16_t version, const void *req, const km_rpc_opts *opts,
		   km_rpc_cb cb, void *arg)
{
	const km_api_info *api = km_api_lookup(api_key);
	km_wr w;
	km_err rc;

	if (!api || !km_api_version_supported(api_key, version))
		return KM_ERR_UNSUPPORTED;
	km_wr_init(&w);
	api->request.encode(&w, version, req);
	rc = km_wr_ok(&w) ? km_rpc_call_raw(c, api_key, version, w.buf, w.len, opts, cb, arg)
			  : (w.err == KM_ERR_NOMEM ? KM_ERR_NOMEM : KM_ERR_ENCODE);
	km_wr_free(&w);
	return rc;
}

void km_net_rpc_client_gone(km_net_client *c)
{
	km_net_rpc **head = km_net_client_rpc_waiting(c), *x;

	while ((x = *head) != NULL) {
		km_rpc_response r = {.err = KM_ERR_CLOSED};
		unlink_waiting(x);
		deliver(x, c, &r);
		call_free(x);
	}
}
