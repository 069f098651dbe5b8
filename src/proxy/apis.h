/* Proxy-internal: the API table. One row per API key says what happens to a request and to its response. */
#ifndef KMIRROR_PROXY_APIS_H
#define KMIRROR_PROXY_APIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>

#include "kmirror/api.h"
#include "kmirror/error.h"
#include "kmirror/fetch.h"
#include "kmirror/net.h"
#include "kmirror/wire.h"

typedef struct km_session km_session;
typedef struct km_rewrite_ctx km_rewrite_ctx;

/* What happens to a request (the row's default; a classify hook may choose another per request). */
typedef enum {
	KM_REQ_FORWARD = 0, /* cut-through: forwarded as soon as its header has been read */
	KM_REQ_HOLD,        /* held until whole; on_request reads it, then it is forwarded (as is or rewritten) or answered */
	KM_REQ_LOCAL,       /* held until whole and answered by the proxy (on_request, now or later); never forwarded */
} km_req_action;

/* What happens to its response. */
typedef enum {
	KM_RESP_FORWARD = 0, /* cut-through */
	KM_RESP_STREAM,      /* sent on as it arrives, walked on the way (Fetch): hooks patch fields in place */
	KM_RESP_WHOLE,       /* held until whole, then rewritten (decode and re-encode, or merged with a local part) */
	KM_RESP_LOCAL,       /* the proxy's own answer: no upstream response; sent in FIFO order */
} km_resp_action;

extern const char *const km_req_action_names[];
extern const char *const km_resp_action_names[];

typedef struct km_resp km_resp;
typedef km_err (*km_resp_hook)(km_resp *rs);
typedef struct km_proxy_api km_proxy_api;

/* km_req.marks: a stage's note to its own response hooks. */
#define KM_REQ_MARK_OOR_HOLD (1u << 0) /* swap.c: OFFSET_OUT_OF_RANGE answered as OFFSET_NOT_AVAILABLE */

/* One request, as its classify and on_request hooks see it and decide about it. */
/* The maps a Fetch waiting at the tail names (more: it wakes on any tail). */
#define KM_TAIL_MAPS 8

typedef struct km_req {
	km_session *s;
	const km_proxy_api *api;  /* the request's row (its stages run in the row's order) */
	uint64_t seq;             /* the request's number in its session (for km_session_answer) */
	const km_req_header *h;
	/*
	 * classify: the frame's first body_len bytes, in one piece. on_request: the whole frame
	 * (body_len == frame_len), or, for a row that reads in place (in_place), still only what
	 * classify had: the frame itself is then read in in.
	 */
	const uint8_t *body;
	size_t body_len;          /* bytes at body (frame without its size prefix) */
	size_t frame_len;         /* the whole frame without its size prefix */
	/* decisions, preset from the row */
	km_req_action action;
	km_resp_action resp;
	bool expect_response;     /* false: the broker sends nothing back (Produce with acks=0) */
	size_t need;              /* classify: call again once this many body bytes have arrived */
	void *ctx;                /* per-request context, handed to the response hooks */
	void (*ctx_free)(void *ctx);
	km_resp_hook on_response; /* this request's whole-response hook (e.g. merging a local part); NULL: the row's */
	uint32_t marks;           /* what stages note for their own response hooks (KM_REQ_MARK_*); kept with the request */
	struct evbuffer *answer;  /* LOCAL (or a HOLD answered here): the response body, after the response header */
	bool pending;             /* LOCAL answered later with km_session_answer */
	/*
	 * HOLD: a new frame body (header included) to forward instead. An on_request that sets neither
	 * this nor answer nor pending forwards the frame as it is, moved like a FORWARD row's (no copy).
	 */
	struct evbuffer *rewritten;
	const char *close_reason; /* set with KM_ERR_* to close the connection (a request the proxy refuses to pass) */
	bool wait_at_tail;        /* a Fetch hook: hold the request KM_FETCH_TAIL_WAIT_MS first (km_session_fetch_may_wait) */
	/* What that wait ends on as well: one of these maps' tail moving (km_session_set_tail_moved); any: every map. */
	const void *tail_maps[KM_TAIL_MAPS];
	size_t ntail_maps;
	bool tail_any;
	/*
	 * on_request: the client's input, the whole frame's size prefix at its start and the frame
	 * (frame_len bytes) at in_off, possibly across many chains: read it with km_evrd, reference
	 * its bytes; it must not be drained or changed (the session moves or drains the frame after).
	 */
	struct evbuffer *in;
	size_t in_off;
} km_req;

/* A whole response, as an on_response hook sees it. */
struct km_resp {
	int16_t key, version;
	struct evbuffer *in;      /* holds the whole frame at its start (size prefix included): consume exactly frame_len + 4 */
	size_t frame_len;         /* without the size prefix */
	size_t body_off;          /* frame offset of the body, after the response header */
	struct evbuffer *out;     /* where the client's frame goes (size prefix included); sent once the hook succeeds */
	km_rewrite_ctx *rw;
	void *ctx;                /* the request's context */
};

/*
 * A streamed response's hooks: called at the walk's events; they may patch bytes at or after the
 * event's offsets. A hook that needs a few bytes past the event's that have not arrived returns
 * KM_STREAM_AGAIN: nothing from the event's start on is sent, and the event comes again when more
 * bytes have (a hook must then not have patched anything yet).
 */
#define KM_STREAM_AGAIN ((km_err)-1900)
/* One walk event of a streamed response, as its stages' hooks see it. */
typedef struct km_stream_ev {
	const km_proxy_api *api;  /* the request's row (its stream stages run in order) */
	km_session *s;
	km_fetch_walk *w;
	struct evbuffer *in;      /* what has arrived and is not sent yet */
	size_t first;             /* the frame offset of in's first byte */
	void *ctx;                /* the request's context */
	uint32_t marks;           /* what the request's stages noted (km_req.marks) */
} km_stream_ev;
typedef struct km_stream_hooks {
	km_err (*on_partition)(const km_stream_ev *e);
	km_err (*on_batch)(const km_stream_ev *e);
	/* The tail (top-level tagged fields) is whole at tail (len bytes); write exactly len bytes to out. */
	km_err (*on_tail)(const uint8_t *tail, size_t len, uint8_t *out, km_rewrite_ctx *rw, void *ctx);
} km_stream_hooks;

typedef km_err (*km_req_hook)(km_req *rq);
/* A rewriter of a whole response body (after the response header). */
typedef km_err (*km_body_rewriter)(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);

/*
 * Requests that are small by nature get a frame cap of their own, below max_frame_bytes: what
 * comes before authentication (ApiVersions, SASL; as a broker's sasl.server.max.receive.size), and
 * what the proxy reads and answers itself (the mirror RPCs).
 */
typedef enum {
	KM_FRAME_CAP_NONE = 0,  /* max_frame_bytes */
	KM_FRAME_CAP_AUTH,      /* max_auth_frame_bytes */
	KM_FRAME_CAP_LOCAL,     /* max_local_frame_bytes */
} km_frame_cap;

/* The most stages one row composes (one per feature that has a part in the API). */
#define KM_PROXY_STAGES_MAX 7

/*
 * One feature's part in one API: what it asks of the row and the hooks it runs. A feature
 * declares its stages (km_proxy_feature); km_proxy_apis_new composes the stages of every feature,
 * in the fixed order of apis.c, into one row per key (docs/proxy.md, "How stages compose").
 */
typedef struct km_proxy_stage {
	int16_t key;
	bool versions;            /* min_version and max_version below apply (-1 in either: no bound) */
	int16_t min_version, max_version;
	bool shows_lower;         /* ApiVersions still shows the broker's versions below min_version (refused all the same) */
	km_req_action req;        /* the row takes the strongest its stages ask (forward < hold < local) */
	bool in_place;            /* held requests are read in place (every on_request of the row must then) */
	km_frame_cap frame_cap;   /* the row takes the first a stage asks */
	km_req_hook classify;     /* run in stage order; stops at an error or once more bytes are asked for */
	km_req_hook on_request;   /* run in stage order; stops at an error, an answer or a pending answer */
	/* The response: at most one stage of a row sets resp and its rewriter or hook. */
	km_resp_action resp;
	int16_t resp_from;
	km_body_rewriter rewrite;
	km_resp_hook on_response;
	const km_stream_hooks *stream; /* run in stage order at each walk event */
	const char *note;         /* what and why (joined in stage order in the doc table) */
} km_proxy_stage;

/*
 * A feature: its name (the doc table's "stages" column) and its stages, one per key at most.
 * needs_state: its hooks read the mirror state, so its rows' requests wait until the store has
 * loaded (until then nothing would be refused or translated).
 */
typedef struct km_proxy_feature {
	const char *name;
	const km_proxy_stage *stages;
	size_t count;
	bool needs_state;
} km_proxy_feature;

struct km_proxy_api {
	int16_t key;
	const char *name;         /* for logs and docs; NULL: the codec's name */
	int16_t min_version;      /* lowest version served; -1: the codec's */
	int16_t max_version;      /* highest version the hooks were written for; -1: the codec's */
	bool shows_lower;         /* ApiVersions shows the broker's versions below min_version (a stage asked) */
	km_req_action req;
	km_req_hook classify;     /* optional, at the header: may change action, resp, expect_response, or ask for more bytes */
	km_req_hook on_request;   /* HOLD and LOCAL */
	bool in_place;            /* HOLD and LOCAL: on_request reads the frame in rq->in; it is not pulled up into one piece */
	bool needs_state;         /* a feature of the row reads the mirror state: requests wait until it has loaded */
	km_frame_cap frame_cap;   /* a cap of its own on the request's frame */
	km_resp_action resp;
	int16_t resp_from;        /* resp applies from this version on; older versions' responses are forwarded */
	km_body_rewriter rewrite; /* WHOLE: the body rewriter, or */
	km_resp_hook on_response; /* WHOLE: a hook over the buffers */
	const km_stream_hooks *stream; /* STREAM */
	const char *note;         /* what and why, one line (docs/proxy.md shows the table) */
	/* A composed row: its stages in order and the features they come from (a row set by hand: none). */
	const km_proxy_stage *stages[KM_PROXY_STAGES_MAX];
	const char *features[KM_PROXY_STAGES_MAX];
	size_t nstages;
};

/* A table: the codec's broker-listener APIs as plain forwards, with the proxy's own rows over them. */
typedef struct km_proxy_apis km_proxy_apis;

/* The proxy's table: the features' stages composed in the order of apis.c. */
km_proxy_apis *km_proxy_apis_new(void);
/* A table of the codec's plain forwards with the stages of features[0..n) composed over them (tests). */
km_proxy_apis *km_proxy_apis_compose(const km_proxy_feature *const *features, size_t n);
void km_proxy_apis_free(km_proxy_apis *t);
/* Add a row or replace the row of its key (composition, tests); the row is copied as it is, stages and all. */
km_err km_proxy_apis_set(km_proxy_apis *t, const km_proxy_api *row) __attribute__((warn_unused_result));
/* The row of key, or NULL when the proxy does not serve it. */
const km_proxy_api *km_proxy_apis_find(const km_proxy_apis *t, int16_t key);
/* Rows in key order (i < count). */
size_t km_proxy_apis_count(const km_proxy_apis *t);
const km_proxy_api *km_proxy_apis_at(const km_proxy_apis *t, size_t i);

/* The versions a row serves. */
int16_t km_proxy_api_min(const km_proxy_api *a);
int16_t km_proxy_api_max(const km_proxy_api *a);
/* The response action for a version of the row (before classify). */
km_resp_action km_proxy_api_resp(const km_proxy_api *a, int16_t version);
/* The row's name: its own, else the codec's ("Metadata"). */
const char *km_proxy_api_name(const km_proxy_api *a);

/* Request and response header versions for key/version (1 or 2; 0 or 1), rows not in the codec included. */
int km_proxy_request_header_version(int16_t key, int16_t version);
int km_proxy_response_header_version(int16_t key, int16_t version);

/*
 * Acks of a Produce request: p is the frame body (without the size prefix), len what is available
 * (at least the header and the fields up to acks). Returns KM_ERR_DECODE when truncated.
 */
km_err km_proxy_produce_acks(const uint8_t *p, size_t len, int16_t version, int16_t *acks)
	__attribute__((warn_unused_result));
/* The Produce stage of the proxy's own feature: acks and the FIFO slot; the v10+ tail. */
km_err km_proxy_produce_classify(km_req *rq);
km_err km_proxy_produce_response(km_resp *rs);
/* The Fetch stage's tail hook (v16+ NodeEndpoints, same length). */
km_err km_proxy_fetch_tail(const uint8_t *tail, size_t len, uint8_t *out, km_rewrite_ctx *rw, void *ctx);

/* The features, each declared by its own file (composed in this order; docs/proxy.md says why). */
extern const km_proxy_feature km_endpoints_feature; /* endpoints.c: versions, acks, broker endpoints */
extern const km_proxy_feature km_swap_hold_feature;  /* swap.c: the Fetch hold after an upstream swap */
extern const km_proxy_feature km_mirror_rpc_feature; /* mirror_rpc.c: the ten mirror RPCs */
extern const km_proxy_feature km_mirror_name_feature; /* mirror_names.c: mirror.name in the config APIs */
extern const km_proxy_feature km_ro_feature;         /* readonly.c: writes to mirror topics refused */
extern const km_proxy_feature km_off_feature;        /* offsets.c: the source's offsets on mirror topics */
extern const km_proxy_feature km_share_off_feature;  /* share_offsets.c: the same for share groups */

/* Write the Markdown table of t (docs/proxy.md embeds it; a unit test checks it). */
void km_proxy_apis_write_doc(const km_proxy_apis *t, struct evbuffer *out);

#endif
