/* Calling a Kafka API by key on a km_net_client: version picking, encode and decode through the API table, the retry policy. */
#ifndef KMIRROR_RPC_H
#define KMIRROR_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/arena.h"
#include "kmirror/error.h"
#include "kmirror/net.h"

/*
 * The version of api_key to speak on c: the highest both the broker and the codec support
 * (km_net_client_version), capped at hi (the last version the caller's code was written for);
 * -1 when that is below lo (the first with what the caller needs), or when the broker lacks the key.
 */
int16_t km_net_version_pick(const km_net_client *c, int16_t api_key, int16_t lo, int16_t hi);

/* What the one retry policy says about an error (docs/net.md, "Calling an API"). */
typedef enum {
	KM_RPC_DONE = 0, /* success, or an error a retry will not fix */
	KM_RPC_RETRY,    /* retriable: the same request again after a backoff */
	KM_RPC_REFRESH,  /* a leader or coordinator moved (or the connection is gone): find it again, then retry */
} km_rpc_action;

km_rpc_action km_rpc_classify(km_err err);
const char *km_rpc_action_name(km_rpc_action a);
/* Backoff before retry number attempt (1, 2, ...): base doubled per attempt, capped at max, +-20% jitter. */
int64_t km_rpc_backoff_ms(unsigned attempt, int64_t base_ms, int64_t max_ms);

typedef struct km_rpc_response {
	int16_t api_key;
	int16_t version;
	km_err err;           /* KM_OK: msg is decoded; else KM_ERR_TIMEOUT, _CLOSED, _IO, _DECODE, _NOMEM, ... */
	km_err code;          /* the response's own error (opts.error_of), 0 when none or not decoded */
	km_rpc_action action; /* the policy's word on err, or on code when err is KM_OK */
	unsigned attempts;    /* how many times the request was sent */
	void *msg;            /* the decoded response struct (km_<name>_response), NULL unless decoded */
	km_arena *arena;      /* what msg lives in: the layer's (only for the callback) or opts.arena */
	const char *why;      /* with KM_ERR_DECODE: where the decode failed; "" otherwise */
} km_rpc_response;

/*
 * The connection's error in r: KM_OK when a body came, whether or not it decoded into r->msg. Only
 * this says the connection is unsound (drop it, find the broker again). r->err also holds the
 * codec's refusal of a body (KM_ERR_DECODE with a why; a client that cannot read a frame fails with
 * KM_ERR_DECODE too, but without one) and running out of memory or over the arena's cap while
 * decoding: the connection is sound, and the request may go again on it.
 */
static inline km_err km_rpc_transport_err(const km_rpc_response *r)
{
	if (r->err == KM_ERR_TOO_LARGE || (r->err == KM_ERR_DECODE && r->why && r->why[0]) ||
	    (r->arena && km_arena_err(r->arena) != KM_OK))
		return KM_OK;
	return r->err;
}

/* Whether r failed although the connection is sound: its body did not decode (see above). */
static inline bool km_rpc_undecoded(const km_rpc_response *r)
{
	return r->err != KM_OK && km_rpc_transport_err(r) == KM_OK;
}


/*
 * Called exactly once per km_rpc_call that returned KM_OK (also when the client is freed first,
 * with KM_ERR_CLOSED). r and what it points to are valid only during the call unless opts.arena
 * was given; the callback may free the client.
 */
typedef void (*km_rpc_cb)(km_net_client *c, const km_rpc_response *r, void *arg);

typedef struct km_rpc_opts {
	/*
	 * The response's top-level error code, for the policy (e.g. the mirror RPCs' ErrorCode). When
	 * set, a decoded response whose code is KM_RPC_RETRY is sent again on the same connection after
	 * a backoff, while retry_budget_ms allows; other codes go to the callback.
	 */
	km_err (*error_of)(const void *msg);
	int64_t retry_budget_ms;   /* resend while the next attempt starts within this of the first; 0: never */
	int64_t backoff_ms;        /* 0: 100 */
	int64_t backoff_max_ms;    /* 0: 1000 */
	/*
	 * NULL: the response is decoded into an arena of the layer's, freed when the callback returns.
	 * Set: the body is copied into this arena and decoded there, so msg lives as long as it.
	 */
	km_arena *arena;
	size_t arena_cap;          /* cap of the layer's arena; 0: KM_ARENA_DEFAULT_CAP */
} km_rpc_opts;

/*
 * Encode req (a km_<name>_request struct) as api_key at version with the API table's codec, send it
 * on c, and call cb with the response decoded by the table's codec. opts may be NULL (no resend, the
 * layer's arena). KM_ERR_UNSUPPORTED for a key or version the codec lacks, KM_ERR_ENCODE when req
 * does not fit the version, else what km_net_client_request returns; cb is not called then.
 */
km_err km_rpc_call(km_net_client *c, int16_t api_key, int16_t version, const void *req, const km_rpc_opts *opts,
		   km_rpc_cb cb, void *arg) __attribute__((warn_unused_result));

/*
 * The same with an already encoded body (callers that build the bytes themselves: a Produce from
 * fetched batches). body is copied.
 */
km_err km_rpc_call_raw(km_net_client *c, int16_t api_key, int16_t version, const uint8_t *body, size_t len,
		       const km_rpc_opts *opts, km_rpc_cb cb, void *arg) __attribute__((warn_unused_result));

#endif
