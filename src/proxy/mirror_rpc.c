/* The mirror RPCs and the mirror.name topic config: checked here, authorized by the destination's broker as the caller, carried out by the state store. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/mirror.h"
#include "kmirror/net.h"
#include "kmirror/msg/alter_mirror_request.h"
#include "kmirror/msg/alter_mirror_response.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_mirror_request.h"
#include "kmirror/msg/create_mirror_response.h"
#include "kmirror/msg/delete_mirror_request.h"
#include "kmirror/msg/delete_mirror_response.h"
#include "kmirror/msg/describe_mirrors_request.h"
#include "kmirror/msg/describe_mirrors_response.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"
#include "kmirror/msg/list_mirrors_request.h"
#include "kmirror/msg/list_mirrors_response.h"
#include "kmirror/msg/pause_mirror_topics_request.h"
#include "kmirror/msg/pause_mirror_topics_response.h"
#include "kmirror/msg/resume_mirror_topics_request.h"
#include "kmirror/msg/resume_mirror_topics_response.h"
#include "kmirror/msg/start_mirror_topics_request.h"
#include "kmirror/msg/start_mirror_topics_response.h"
#include "kmirror/msg/stop_mirror_topics_request.h"
#include "kmirror/msg/stop_mirror_topics_response.h"
#include "kmirror/state.h"
#include "proxy/mirror_rpc.h"
#include "proxy/rewrite.h"

/* The versions of the authorizing probes (Kafka 4.x brokers serve IncrementalAlterConfigs 0-1, DescribeConfigs 1-4). */
#define KM_PROBE_IAC_VERSION 1
#define KM_PROBE_DESCRIBE_VERSION 4
/* A config key of the cluster-wide broker defaults, asked for only to be authorized (DESCRIBE_CONFIGS on CLUSTER). */
#define KM_PROBE_DESCRIBE_KEY "compression.type"

static const char no_store_msg[] = "kmirrord has no state store: mirror operations are not available";
static const char loading_msg[] = "mirror state is loading";

/* How an RPC is authorized (docs/protocol.md, "Authorization"). */
typedef enum { AUTH_CLUSTER_ALTER, AUTH_CLUSTER_DESCRIBE, AUTH_TOPICS } auth_kind;

/* The request of any of the ten RPCs, decoded. */
typedef union mirror_req {
	km_create_mirror_request create;
	km_delete_mirror_request del;
	km_list_mirrors_request list;
	km_describe_mirrors_request describe;
	km_alter_mirror_request alter;
	km_start_mirror_topics_request start;
	km_stop_mirror_topics_request stop;
	km_pause_mirror_topics_request pause;
	km_resume_mirror_topics_request resume;
	km_last_mirrored_offsets_request lmo;
	km_incremental_alter_configs_request iac;
	km_alter_configs_request ac;
} mirror_req;

/*
 * One operation in progress: owned by nobody but itself, freed once nothing can call it back
 * (no probe pending, no store call pending). The session may go first: then its probes report
 * KM_ERR_CLOSED, and a store result finds km_session_answer saying KM_ERR_CLOSED.
 */
typedef struct mop {
	struct mop *prev, *next; /* every live operation (km_mirror_rpc_detach) */
	km_session_set *set;     /* NULL: the proxy is gone, drop the answer */
	uint64_t sid, seq;
	km_state *st;
	km_mirror *mi;           /* creates missing destination topics for a start; NULL: none */
	km_proxy_counters *metrics; /* the proxy's, while set is not NULL */
	int16_t key, version;
	uint8_t *req;            /* the request body, copied: decoded strings borrow it */
	size_t req_len;
	km_arena a;
	mirror_req m;
	int probes;              /* probes sent and not answered */
	bool gone;               /* the session closed */
	/* topic operations */
	km_topic_op op;
	const char *mirror;      /* NUL-terminated copy of the mirror name */
	const char **topics;     /* NUL-terminated copies, in request order */
	size_t ntopics;
	int16_t *tcode;          /* each topic's outcome so far (authorization) */
	const char **tmsg;
	/* config requests */
	km_mcfg_split sp;
	int32_t next_res;
	bool validate_only;
	km_req *now;             /* inside the request's hook: an answer goes to now->answer */
} mop;

static mop *live_ops;

void km_mirror_rpc_detach(km_session_set *set)
{
	for (mop *op = live_ops; op; op = op->next)
		if (op->set == set)
			op->set = NULL;
}

static void op_free(mop *op)
{
	if (op->prev)
		op->prev->next = op->next;
	else if (live_ops == op)
		live_ops = op->next;
	if (op->next)
		op->next->prev = op->prev;
	km_arena_free(&op->a);
	if (op->req && (op->key == KM_API_CREATE_MIRROR || op->key == KM_API_ALTER_MIRROR))
		OPENSSL_cleanse(op->req, op->req_len); /* it holds the configuration in clear, secrets included */
	free(op->req);
	free(op);
}

/* Where the request's body starts: the session reads only the fixed part of the header. */
static bool body_offset(const km_req *rq, size_t *off)
{
	km_req_header h;
	int hv = km_proxy_request_header_version(rq->h->api_key, rq->h->api_version);
	if (hv < 0 || km_net_parse_request_header(rq->body, rq->frame_len, hv, &h) != KM_OK)
		return false;
	*off = h.body_offset;
	return true;
}

/* NULL with *rc: KM_ERR_DECODE when the request header cannot be parsed, else KM_ERR_NOMEM. */
static mop *op_new(km_req *rq, km_err *rc)
{
	const km_session_host *host = km_session_host_of(rq->s);
	size_t off;
	mop *op;
	*rc = KM_ERR_DECODE;
	if (!body_offset(rq, &off))
		return NULL;
	*rc = KM_ERR_NOMEM;
	op = calloc(1, sizeof(*op));
	if (!op || !(op->req = malloc(rq->frame_len + 1))) {
		free(op);
		return NULL;
	}
	*rc = KM_OK;
	op->set = host->sessions;
	op->sid = km_session_id(rq->s);
	op->seq = rq->seq;
	op->st = host->state;
	op->mi = host->mirror;
	op->metrics = host->metrics;
	op->key = rq->h->api_key;
	op->version = rq->h->api_version;
	/* The body after the request header. */
	op->req_len = rq->frame_len - off;
	memcpy(op->req, rq->body + off, op->req_len);
	km_arena_init(&op->a, 0);
	op->next = live_ops;
	if (live_ops)
		live_ops->prev = op;
	live_ops = op;
	return op;
}

static const char *op_strdup(mop *op, km_str s)
{
	char *p = km_arena_alloc(&op->a, (size_t)(s.len > 0 ? s.len : 0) + 1);
	if (!p)
		return "";
	if (s.len > 0)
		memcpy(p, s.p, (size_t)s.len);
	p[s.len > 0 ? s.len : 0] = '\0';
	return p;
}

static const char *op_printf(mop *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *op_printf(mop *op, const char *fmt, ...)
{
	char buf[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return op_strdup(op, km_str_c(buf));
}

static km_str cstr(const char *s)
{
	return s ? km_str_c(s) : KM_STR_NULL;
}

/* Decode the copied request with the codec of its key. */
static km_err op_decode(mop *op)
{
	const km_api_info *api = km_api_lookup(op->key);
	km_rd r;
	if (!api)
		return KM_ERR_UNSUPPORTED;
	km_rd_init(&r, op->req, op->req_len);
	api->request.init(&op->m);
	if (api->request.decode(&r, op->version, &op->m, &op->a) != KM_OK || !km_rd_ok(&r) || km_rd_left(&r))
		return KM_ERR_DECODE;
	return KM_OK;
}

/* ---- answers ---- */

/* An error in an answer, for kmirror_mirror_rpc_errors_total (the ten RPCs only, not mirror.name). */
static void count_error(const mop *op, int code)
{
	if (code && op->set && op->metrics && op->key >= KM_API_CREATE_MIRROR && op->key <= KM_API_LAST_MIRRORED_OFFSETS)
		km_metrics_mirror_rpc_error(op->metrics, op->key, code);
}

static struct evbuffer *encode_response(int16_t key, int16_t version, const void *resp)
{
	const km_api_info *api = km_api_lookup(key);
	struct evbuffer *b;
	km_wr w;
	km_wr_init(&w);
	api->response.encode(&w, version, resp);
	b = km_wr_ok(&w) ? evbuffer_new() : NULL;
	if (b && evbuffer_add(b, w.buf, w.len) != 0) {
		evbuffer_free(b);
		b = NULL;
	}
	km_wr_free(&w);
	return b;
}

/* Send the answer (unless the session or the proxy is gone) and free the operation. */
static void op_answer(mop *op, const void *resp)
{
	struct evbuffer *b = encode_response(op->key, op->version, resp);
	if (!b) {
		KM_WARN("proxy", op->sid, "cannot encode the answer to api key %d", op->key);
	} else if (op->now) {
		/* Answered from the hook itself: the request is not pending yet. */
		op->now->answer = b;
		b = NULL;
	} else if (op->set && !op->gone) {
		km_err rc = km_session_answer(op->set, op->sid, op->seq, b);
		if (rc != KM_OK)
			KM_DEBUG("proxy", op->sid, "answer to api key %d dropped: %s", op->key, km_err_name(rc));
	}
	if (b)
		evbuffer_free(b);
	op_free(op);
}

/* Topic operations' four responses have one layout; the macro fills whichever it is given. */
#define FILL_TOPICS_RESPONSE(R, TYPE, op, code_, msg_, tcodes, tmsgs)                                       \
	do {                                                                                                \
		TYPE##_init(&(R));                                                                          \
		(R).error_code = (int16_t)(code_);                                                         \
		(R).error_message = (code_) ? cstr(msg_) : KM_STR_NULL;                                    \
		(R).mirror_name = cstr((op)->mirror);                                                      \
		(R).topics.count = (int32_t)(op)->ntopics;                                                 \
		(R).topics.items = km_arena_calloc(&(op)->a, sizeof(*(R).topics.items) * ((op)->ntopics + 1)); \
		for (size_t i_ = 0; (R).topics.items && i_ < (op)->ntopics; i_++) {                        \
			TYPE##_topic_result_init(&(R).topics.items[i_]);                                   \
			(R).topics.items[i_].name = km_str_c((op)->topics[i_]);                            \
			(R).topics.items[i_].error_code = (tcodes)[i_];                                    \
			(R).topics.items[i_].error_message = (tcodes)[i_] ? cstr((tmsgs)[i_]) : KM_STR_NULL; \
		}                                                                                          \
		if (!(R).topics.items)                                                                     \
			(R).topics.count = 0;                                                              \
	} while (0)

/* Answer a topic operation with per-topic outcomes (and a top-level code). */
static void answer_topics(mop *op, km_err code, const char *msg, const int16_t *tcodes, const char *const *tmsgs)
{
	union {
		km_start_mirror_topics_response start;
		km_stop_mirror_topics_response stop;
		km_pause_mirror_topics_response pause;
		km_resume_mirror_topics_response resume;
	} r;
	/* One count for a request refused as a whole, else one per refused topic. */
	if (code)
		count_error(op, code);
	for (size_t i = 0; !code && i < op->ntopics; i++)
		count_error(op, tcodes[i]);
	switch (op->key) {
	case KM_API_START_MIRROR_TOPICS:
		FILL_TOPICS_RESPONSE(r.start, km_start_mirror_topics_response, op, code, msg, tcodes, tmsgs);
		break;
	case KM_API_STOP_MIRROR_TOPICS:
		FILL_TOPICS_RESPONSE(r.stop, km_stop_mirror_topics_response, op, code, msg, tcodes, tmsgs);
		break;
	case KM_API_PAUSE_MIRROR_TOPICS:
		FILL_TOPICS_RESPONSE(r.pause, km_pause_mirror_topics_response, op, code, msg, tcodes, tmsgs);
		break;
	default:
		FILL_TOPICS_RESPONSE(r.resume, km_resume_mirror_topics_response, op, code, msg, tcodes, tmsgs);
		break;
	}
	op_answer(op, &r);
}

static bool is_topic_op(int16_t key)
{
	return key >= KM_API_START_MIRROR_TOPICS && key <= KM_API_RESUME_MIRROR_TOPICS;
}

/* Answer any of the RPCs with one error (every topic of a topic operation gets it too). */
static void answer_error(mop *op, km_err code, const char *msg)
{
	union {
		km_create_mirror_response create;
		km_delete_mirror_response del;
		km_alter_mirror_response alter;
		km_list_mirrors_response list;
		km_describe_mirrors_response describe;
		km_last_mirrored_offsets_response lmo;
	} r;
	if (is_topic_op(op->key)) {
		int16_t *codes = km_arena_calloc(&op->a, sizeof(int16_t) * (op->ntopics + 1));
		const char **msgs = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
		for (size_t i = 0; codes && msgs && i < op->ntopics; i++) {
			codes[i] = (int16_t)code;
			msgs[i] = msg;
		}
		if (!codes || !msgs)
			op->ntopics = 0;
		answer_topics(op, code, msg, codes, msgs);
		return;
	}
	count_error(op, code);
	memset(&r, 0, sizeof(r));
	switch (op->key) {
	case KM_API_CREATE_MIRROR:
		km_create_mirror_response_init(&r.create);
		r.create.error_code = (int16_t)code;
		r.create.error_message = cstr(msg);
		break;
	case KM_API_DELETE_MIRROR:
		km_delete_mirror_response_init(&r.del);
		r.del.error_code = (int16_t)code;
		r.del.error_message = cstr(msg);
		break;
	case KM_API_ALTER_MIRROR:
		km_alter_mirror_response_init(&r.alter);
		r.alter.error_code = (int16_t)code;
		r.alter.error_message = cstr(msg);
		break;
	case KM_API_LIST_MIRRORS:
		km_list_mirrors_response_init(&r.list);
		r.list.error_code = (int16_t)code;
		r.list.error_message = cstr(msg);
		r.list.mirrors.count = 0;
		break;
	case KM_API_DESCRIBE_MIRRORS:
		km_describe_mirrors_response_init(&r.describe);
		r.describe.error_code = (int16_t)code;
		r.describe.error_message = cstr(msg);
		r.describe.mirrors.count = 0;
		break;
	default:
		km_last_mirrored_offsets_response_init(&r.lmo);
		r.lmo.error_code = (int16_t)code;
		r.lmo.error_message = cstr(msg);
		r.lmo.topics.count = 0;
		break;
	}
	op_answer(op, &r);
}

/* ---- authorization: a validate-only request on the caller's own upstream connection ---- */

static auth_kind auth_of(int16_t key)
{
	switch (key) {
	case KM_API_CREATE_MIRROR:
	case KM_API_DELETE_MIRROR:
	case KM_API_ALTER_MIRROR:
		return AUTH_CLUSTER_ALTER;
	case KM_API_LIST_MIRRORS:
	case KM_API_DESCRIBE_MIRRORS:
	case KM_API_LAST_MIRRORED_OFFSETS:
		return AUTH_CLUSTER_DESCRIBE;
	default:
		return AUTH_TOPICS;
	}
}

/* Encode a request body with the codec of key. */
static km_err encode_request(int16_t key, int16_t version, const void *m, km_wr *w)
{
	const km_api_info *api = km_api_lookup(key);
	km_wr_init(w);
	if (!api)
		return KM_ERR_UNSUPPORTED;
	api->request.encode(w, version, m);
	return km_wr_ok(w) ? KM_OK : KM_ERR_ENCODE;
}

static km_err send_probe(km_req *rq, mop *op, int16_t key, int16_t version, const void *m, km_session_probe_cb cb)
{
	km_wr w;
	km_err rc = encode_request(key, version, m, &w);
	if (rc == KM_OK)
		rc = km_session_probe(rq->s, key, version, w.buf, w.len, cb, op);
	km_wr_free(&w);
	if (rc == KM_OK)
		op->probes++;
	return rc;
}

static void proceed(mop *op);

/* The topic probe's verdict on topic (names are unique in the request: check_request), or NULL. */
static const km_incremental_alter_configs_response_alter_configs_resource_response *
probe_result(const km_incremental_alter_configs_response *m, const char *topic)
{
	for (int32_t k = 0; k < m->responses.count; k++) {
		const km_incremental_alter_configs_response_alter_configs_resource_response *x = &m->responses.items[k];
		if (x->resource_type == KM_RESOURCE_TOPIC && km_str_eq_c(x->resource_name, topic))
			return x;
	}
	return NULL;
}

/* The authorizing probe's answer: refusals become the answer, the rest goes on to the store. */
static void auth_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	mop *op = arg;
	auth_kind kind = auth_of(op->key);
	km_arena a;
	km_rd r;
	int16_t code = 0;
	km_str msg = KM_STR_NULL;
	bool unreadable = false;

	op->probes--;
	if (err != KM_OK) {
		op_free(op); /* the session is gone: nothing to answer */
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&r, body, len);
	if (kind == AUTH_CLUSTER_DESCRIBE) {
		km_describe_configs_response m;
		km_describe_configs_response_init(&m);
		if (km_describe_configs_response_decode(&r, KM_PROBE_DESCRIBE_VERSION, &m, &a) != KM_OK ||
		    m.results.count != 1)
			unreadable = true;
		else {
			code = m.results.items[0].error_code;
			msg = m.results.items[0].error_message;
		}
	} else {
		km_incremental_alter_configs_response m;
		km_incremental_alter_configs_response_init(&m);
		if (km_incremental_alter_configs_response_decode(&r, KM_PROBE_IAC_VERSION, &m, &a) != KM_OK ||
		    m.responses.count != (kind == AUTH_TOPICS ? (int32_t)op->ntopics : 1))
			unreadable = true;
		else if (kind == AUTH_TOPICS) {
			for (size_t i = 0; i < op->ntopics; i++) {
				/*
				 * By name, never by position: the broker answers refused resources first and the
				 * rest in its own map's order, so position i may be another topic's verdict.
				 */
				const km_incremental_alter_configs_response_alter_configs_resource_response *x =
					probe_result(&m, op->topics[i]);
				if (!x) {
					unreadable = true;
					break;
				}
				/*
				 * An unknown topic got past the authorizer: it is the store's to judge (start needs
				 * the topic, stop of a deleted one does not). Any other error means the check did
				 * not pass, so the topic is refused with it: never acted on unchecked.
				 */
				if (x->error_code == 0 || x->error_code == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION)
					continue;
				if (x->error_code == KM_KAFKA_TOPIC_AUTHORIZATION_FAILED ||
				    x->error_code == KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED) {
					op->tcode[i] = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
					op->tmsg[i] = op_printf(op,
								"not authorized to %s mirroring of topic %s: the destination's "
								"authorizer refused ALTER_CONFIGS on the topic",
								km_topic_op_name(op->op), op->topics[i]);
				} else {
					op->tcode[i] = x->error_code;
					op->tmsg[i] = op_printf(op,
								"cannot %s mirroring of topic %s: the authorization check "
								"failed: %s: %.*s",
								km_topic_op_name(op->op), op->topics[i],
								km_err_name(x->error_code),
								x->error_message.len > 0 ? (int)x->error_message.len : 0,
								x->error_message.len > 0 ? x->error_message.p : "");
				}
			}
		} else {
			code = m.responses.items[0].error_code;
			msg = m.responses.items[0].error_message;
		}
	}
	if (unreadable) {
		km_arena_free(&a);
		answer_error(op, KM_KAFKA_UNKNOWN_SERVER_ERROR, "the authorization check's response could not be read");
		return;
	}
	if (code == KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED) {
		km_arena_free(&a);
		answer_error(op, code,
			     kind == AUTH_CLUSTER_ALTER ?
				     "not authorized to change mirrors: the destination's authorizer refused ALTER_CONFIGS on "
				     "the cluster" :
				     "not authorized to describe mirrors: the destination's authorizer refused "
				     "DESCRIBE_CONFIGS on the cluster");
		return;
	}
	if (code != 0) {
		const char *m = op_printf(op, "authorization check failed: %s: %.*s", km_err_name(code),
					  msg.len > 0 ? (int)msg.len : 0, msg.len > 0 ? msg.p : "");
		km_arena_free(&a);
		answer_error(op, code, m);
		return;
	}
	km_arena_free(&a);
	proceed(op);
}

static km_err authorize(km_req *rq, mop *op)
{
	switch (auth_of(op->key)) {
	case AUTH_CLUSTER_ALTER: {
		km_incremental_alter_configs_request m;
		km_incremental_alter_configs_request_alter_configs_resource res;
		km_incremental_alter_configs_request_init(&m);
		km_incremental_alter_configs_request_alter_configs_resource_init(&res);
		res.resource_type = KM_RESOURCE_BROKER;
		res.resource_name = km_str_c("");
		res.configs.count = 0;
		m.resources.count = 1;
		m.resources.items = &res;
		m.validate_only = true;
		return send_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, KM_PROBE_IAC_VERSION, &m, auth_done);
	}
	case AUTH_CLUSTER_DESCRIBE: {
		km_describe_configs_request m;
		km_describe_configs_request_describe_configs_resource res;
		km_str key = km_str_c(KM_PROBE_DESCRIBE_KEY);
		km_describe_configs_request_init(&m);
		km_describe_configs_request_describe_configs_resource_init(&res);
		res.resource_type = KM_RESOURCE_BROKER;
		res.resource_name = km_str_c("");
		res.configuration_keys.count = 1;
		res.configuration_keys.items = &key;
		m.resources.count = 1;
		m.resources.items = &res;
		return send_probe(rq, op, KM_API_DESCRIBE_CONFIGS, KM_PROBE_DESCRIBE_VERSION, &m, auth_done);
	}
	default: {
		km_incremental_alter_configs_request m;
		km_incremental_alter_configs_request_alter_configs_resource *res =
			km_arena_calloc(&op->a, sizeof(*res) * (op->ntopics + 1));
		if (!res)
			return KM_ERR_NOMEM;
		km_incremental_alter_configs_request_init(&m);
		for (size_t i = 0; i < op->ntopics; i++) {
			km_incremental_alter_configs_request_alter_configs_resource_init(&res[i]);
			res[i].resource_type = KM_RESOURCE_TOPIC;
			res[i].resource_name = km_str_c(op->topics[i]);
			res[i].configs.count = 0;
		}
		m.resources.count = (int32_t)op->ntopics;
		m.resources.items = res;
		m.validate_only = true;
		return send_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, KM_PROBE_IAC_VERSION, &m, auth_done);
	}
	}
}

/* ---- the store ---- */

static void simple_done(void *arg, const km_state_result *res)
{
	mop *op = arg;
	answer_error(op, res->code, res->code ? (res->message ? res->message : km_err_message(res->code)) : NULL);
}

static void topics_done(void *arg, const km_state_result *res)
{
	mop *op = arg;
	size_t k = 0;
	/* The store answered the authorized topics, in order; the refused ones keep their refusal. */
	for (size_t i = 0; i < op->ntopics; i++) {
		if (op->tcode[i])
			continue;
		if (k < res->ntopics) {
			op->tcode[i] = (int16_t)res->topics[k].code;
			op->tmsg[i] = res->topics[k].code ?
					      op_strdup(op, cstr(res->topics[k].message ? res->topics[k].message :
											 km_err_message(res->topics[k].code))) :
					      NULL;
		} else if (res->code) {
			op->tcode[i] = (int16_t)res->code;
			op->tmsg[i] = op_strdup(op, cstr(res->message ? res->message : km_err_message(res->code)));
		}
		k++;
	}
	answer_topics(op, res->code,
		      res->code ? op_strdup(op, cstr(res->message ? res->message : km_err_message(res->code))) : NULL,
		      op->tcode, op->tmsg);
}

/* The topics still unanswered (authorized, not refused by the preparation), for the store. */
static const char **pending_topics(mop *op, size_t *n)
{
	const char **allowed = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
	*n = 0;
	for (size_t i = 0; allowed && i < op->ntopics; i++)
		if (!op->tcode[i])
			allowed[(*n)++] = op->topics[i];
	return allowed;
}

/* The mirror module prepared the start (created what was missing): refusals are answered, the rest go to the store. */
static void prepare_done(void *arg, km_err code, const char *message, const km_state_topic_result *res, size_t nres)
{
	mop *op = arg;
	const char **allowed;
	size_t k = 0, n;

	for (size_t i = 0; i < op->ntopics; i++) {
		if (op->tcode[i])
			continue;
		if (code) {
			op->tcode[i] = (int16_t)code;
			op->tmsg[i] = op_strdup(op, cstr(message ? message : km_err_message(code)));
		} else if (k < nres && res[k].code) {
			op->tcode[i] = (int16_t)res[k].code;
			op->tmsg[i] = op_strdup(op, cstr(res[k].message ? res[k].message : km_err_message(res[k].code)));
		}
		k++;
	}
	allowed = pending_topics(op, &n);
	/* The proxy is gone (shutting down): the store may be too; answer what is known. */
	if (!op->set || !allowed || !n) {
		answer_topics(op, 0, NULL, op->tcode, op->tmsg);
		return;
	}
	km_state_topics(op->st, op->op, op->mirror, allowed, n, topics_done, op);
}

static km_state_kv *config_kv(mop *op, const void *items, int32_t count, size_t stride)
{
	km_state_kv *kv = km_arena_calloc(&op->a, sizeof(*kv) * ((size_t)(count > 0 ? count : 0) + 1));
	for (int32_t i = 0; kv && i < count; i++) {
		/* Create and alter configs share one layout: name, then value. */
		const km_str *f = (const km_str *)((const uint8_t *)items + (size_t)i * stride);
		kv[i].name = op_strdup(op, f[0]);
		kv[i].value = f[1].len < 0 ? NULL : op_strdup(op, f[1]);
	}
	return kv;
}

/* Configuration values may be secrets: wiped once the store has its own (sealed) copy. */
static void wipe_kv(km_state_kv *kv, int32_t count)
{
	for (int32_t i = 0; kv && i < count; i++)
		if (kv[i].value)
			OPENSSL_cleanse((char *)kv[i].value, strlen(kv[i].value));
}

static int64_t lag_of(const km_state_partition_info *p)
{
	/* last_mirrored_offset is the offset after the last record mirrored (docs/protocol.md). */
	if (p->source_log_end < 0 || p->last_mirrored_offset < 0)
		return -1;
	return p->source_log_end > p->last_mirrored_offset ? p->source_log_end - p->last_mirrored_offset : 0;
}

static void answer_list(mop *op)
{
	km_list_mirrors_response r;
	size_t n = km_state_mirror_count(op->st);
	km_list_mirrors_response_init(&r);
	r.mirrors.items = km_arena_calloc(&op->a, sizeof(*r.mirrors.items) * (n + 1));
	r.mirrors.count = r.mirrors.items ? (int32_t)n : 0;
	for (int32_t i = 0; i < r.mirrors.count; i++) {
		const km_state_mirror *m = km_state_mirror_at(op->st, (size_t)i);
		km_list_mirrors_response_listed_mirror_init(&r.mirrors.items[i]);
		r.mirrors.items[i].mirror_name = km_str_c(km_state_mirror_name(m));
		r.mirrors.items[i].source_bootstrap_servers = cstr(km_state_mirror_source(m));
		r.mirrors.items[i].topic_count = (int32_t)km_state_mirror_topic_count(m);
	}
	op_answer(op, &r);
}

static bool named(km_str name, const km_str *names, int32_t n)
{
	for (int32_t i = 0; i < n; i++)
		if (km_str_eq(name, names[i]))
			return true;
	return false;
}

/* The metadata sync's status of mirror, one entry per step (docs/mirror.md, "Metadata sync"). */
static void describe_sync(mop *op, const char *mirror, km_describe_mirrors_response_described_mirror *d)
{
	d->metadata_sync.items = km_arena_calloc(&op->a, sizeof(*d->metadata_sync.items) * KM_SYNC__COUNT);
	d->metadata_sync.count = d->metadata_sync.items ? KM_SYNC__COUNT : 0;
	for (int32_t k = 0; k < d->metadata_sync.count; k++) {
		km_describe_mirrors_response_metadata_sync_status *ds = &d->metadata_sync.items[k];
		km_sync_status st;
		bool owner;
		km_mirror_sync_status(op->mi, mirror, (km_sync_kind)k, &st, &owner);
		km_describe_mirrors_response_metadata_sync_status_init(ds);
		ds->kind = km_str_c(km_sync_kind_name((km_sync_kind)k));
		ds->is_owner = owner;
		ds->last_sync_time_ms = st.last_sync_ms;
		ds->compared = st.compared;
		ds->changes_last_cycle = st.changes_last;
		ds->changes_total = st.changes_total;
		ds->skipped = st.skipped;
		ds->errors_total = st.errors_total;
		/* The module's string lives only until its next call: the answer keeps a copy. */
		ds->last_error = st.last_error ? km_str_c(op_strdup(op, km_str_c(st.last_error))) : KM_STR_NULL;
		ds->last_error_time_ms = st.last_error ? st.last_error_ms : -1;
	}
}

static void describe_one(mop *op, const km_state_mirror *m, km_describe_mirrors_response_described_mirror *d)
{
	const km_describe_mirrors_request *q = &op->m.describe;
	size_t nc = km_state_mirror_config_count(m), nt = km_state_mirror_topic_count(m);

	d->mirror_name = km_str_c(km_state_mirror_name(m));
	d->configs.items = km_arena_calloc(&op->a, sizeof(*d->configs.items) * (nc + 1));
	d->configs.count = 0;
	for (size_t i = 0; d->configs.items && i < nc; i++) {
		km_describe_mirrors_response_described_config *c = &d->configs.items[d->configs.count++];
		const char *name, *value;
		bool secret;
		km_state_mirror_config_at(m, i, &name, &value, &secret);
		km_describe_mirrors_response_described_config_init(c);
		c->name = km_str_c(name);
		c->value = secret ? KM_STR_NULL : cstr(value); /* secrets never leave the store */
		c->is_sensitive = secret;
	}
	d->topics.items = km_arena_calloc(&op->a, sizeof(*d->topics.items) * (nt + 1));
	d->topics.count = 0;
	for (size_t i = 0; d->topics.items && i < nt; i++) {
		const km_state_topic *t = km_state_mirror_topic_at(m, i);
		km_describe_mirrors_response_described_topic *dt;
		size_t np = km_state_topic_partition_count(t);
		const km_uuid *id = km_state_topic_id(t);
		if (q->topics.count >= 0 && !named(km_str_c(km_state_topic_name(t)), q->topics.items, q->topics.count))
			continue;
		dt = &d->topics.items[d->topics.count++];
		km_describe_mirrors_response_described_topic_init(dt);
		dt->name = km_str_c(km_state_topic_name(t));
		if (id)
			dt->topic_id = *id;
		dt->state = km_str_c(km_mp_state_name(km_state_topic_state(t)));
		dt->partitions.items = km_arena_calloc(&op->a, sizeof(*dt->partitions.items) * (np + 1));
		dt->partitions.count = dt->partitions.items ? (int32_t)np : 0;
		for (int32_t k = 0; k < dt->partitions.count; k++) {
			km_describe_mirrors_response_described_partition *dp = &dt->partitions.items[k];
			km_state_partition_info p;
			km_state_topic_partition(t, (size_t)k, &p);
			km_describe_mirrors_response_described_partition_init(dp);
			dp->partition_index = p.partition;
			dp->state = km_str_c(km_mp_state_name(p.state));
			dp->state_change_time_ms = p.state_change_ms;
			dp->source_log_end_offset = p.source_log_end;
			dp->mirrored_offset = p.last_mirrored_offset;
			dp->lag = lag_of(&p);
			dp->skipped_records = p.skipped_records;
			dp->open_transaction_offset = p.open_txn_offset;
			dp->last_error = cstr(p.last_error);
			dp->last_error_time_ms = p.last_error ? p.last_error_ms : -1;
		}
	}
	if (op->mi)
		describe_sync(op, km_state_mirror_name(m), d);
}

static void answer_describe(mop *op)
{
	const km_describe_mirrors_request *q = &op->m.describe;
	km_describe_mirrors_response r;
	size_t n = q->mirror_names.count >= 0 ? (size_t)q->mirror_names.count : km_state_mirror_count(op->st);

	km_describe_mirrors_response_init(&r);
	r.mirrors.items = km_arena_calloc(&op->a, sizeof(*r.mirrors.items) * (n + 1));
	r.mirrors.count = r.mirrors.items ? (int32_t)n : 0;
	for (int32_t i = 0; i < r.mirrors.count; i++) {
		km_describe_mirrors_response_described_mirror *d = &r.mirrors.items[i];
		const km_state_mirror *m;
		km_describe_mirrors_response_described_mirror_init(d);
		d->configs.count = 0;
		d->topics.count = 0;
		if (q->mirror_names.count < 0) {
			m = km_state_mirror_at(op->st, (size_t)i);
		} else {
			const char *name = op_strdup(op, q->mirror_names.items[i]);
			m = km_state_mirror_find(op->st, name);
			if (!m) {
				d->mirror_name = km_str_c(name);
				d->error_code = KM_MIRROR_UNKNOWN_CLUSTER_MIRROR;
				count_error(op, d->error_code);
				d->error_message = km_str_c(op_printf(op, "mirror %s does not exist", name));
				continue;
			}
		}
		describe_one(op, m, d);
	}
	op_answer(op, &r);
}

static void answer_lmo(mop *op)
{
	const km_last_mirrored_offsets_request *q = &op->m.lmo;
	const km_state_mirror *m = *op->mirror ? km_state_mirror_find(op->st, op->mirror) : NULL;
	km_last_mirrored_offsets_response r;
	size_t n;

	if (!m && *op->mirror) {
		answer_error(op, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, op_printf(op, "mirror %s does not exist", op->mirror));
		return;
	}
	n = q->topics.count >= 0 ? (size_t)q->topics.count : km_state_mirror_topic_count(m);
	km_last_mirrored_offsets_response_init(&r);
	r.topics.items = km_arena_calloc(&op->a, sizeof(*r.topics.items) * (n + 1));
	r.topics.count = r.topics.items ? (int32_t)n : 0;
	for (int32_t i = 0; i < r.topics.count; i++) {
		km_last_mirrored_offsets_response_topic_result *tr = &r.topics.items[i];
		const km_state_topic *t;
		const km_last_mirrored_offsets_request_topic_data *qt = q->topics.count >= 0 ? &q->topics.items[i] : NULL;
		size_t np, want;

		km_last_mirrored_offsets_response_topic_result_init(tr);
		tr->partitions.count = 0;
		if (qt) {
			t = km_state_topic_find(op->st, qt->name.p, (size_t)qt->name.len);
			tr->name = qt->name;
			if (!t || (m && km_state_topic_mirror(t) != m)) {
				tr->error_code = KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR;
				count_error(op, tr->error_code);
				tr->error_message = km_str_c(op_printf(op, "topic %.*s is not in %s%s", (int)qt->name.len,
								       qt->name.p, m ? "mirror " : "any mirror",
								       m ? op->mirror : ""));
				continue;
			}
		} else {
			t = km_state_mirror_topic_at(m, (size_t)i);
			tr->name = km_str_c(km_state_topic_name(t));
		}
		np = km_state_topic_partition_count(t);
		want = qt && qt->partitions.count >= 0 ? (size_t)qt->partitions.count : np;
		tr->partitions.items = km_arena_calloc(&op->a, sizeof(*tr->partitions.items) * (want + 1));
		for (size_t k = 0; tr->partitions.items && k < want; k++) {
			km_last_mirrored_offsets_response_partition_result *pr = &tr->partitions.items[tr->partitions.count];
			km_state_partition_info p;
			bool found = false;
			if (qt && qt->partitions.count >= 0) {
				for (size_t j = 0; j < np && !found; j++) {
					km_state_topic_partition(t, j, &p);
					found = p.partition == qt->partitions.items[k];
				}
				if (!found) {
					tr->error_code = KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION;
					count_error(op, tr->error_code);
					tr->error_message =
						km_str_c(op_printf(op, "topic %s has no partition %d in mirror %s",
								   km_state_topic_name(t), (int)qt->partitions.items[k],
								   op->mirror));
					continue;
				}
			} else {
				km_state_topic_partition(t, k, &p);
			}
			km_last_mirrored_offsets_response_partition_result_init(pr);
			pr->partition_index = p.partition;
			pr->state = km_str_c(km_mp_state_name(p.state));
			pr->last_mirrored_offset = p.last_mirrored_offset;
			pr->last_mirrored_epoch = p.last_mirrored_epoch;
			tr->partitions.count++;
		}
	}
	op_answer(op, &r);
}

/* Authorized: carry the operation out. */
static void proceed(mop *op)
{
	if (!km_state_ready(op->st)) {
		answer_error(op, KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS, loading_msg);
		return;
	}
	switch (op->key) {
	case KM_API_CREATE_MIRROR: {
		const km_create_mirror_request *q = &op->m.create;
		km_state_kv *kv = config_kv(op, q->configs.items, q->configs.count, sizeof(*q->configs.items));
		km_state_create_mirror(op->st, op->mirror, kv, (size_t)(q->configs.count > 0 ? q->configs.count : 0),
				       q->validate_only, simple_done, op);
		wipe_kv(kv, q->configs.count); /* the store took its own copy */
		return;
	}
	case KM_API_ALTER_MIRROR: {
		const km_alter_mirror_request *q = &op->m.alter;
		km_state_kv *kv = config_kv(op, q->configs.items, q->configs.count, sizeof(*q->configs.items));
		km_state_alter_mirror(op->st, op->mirror, kv, (size_t)(q->configs.count > 0 ? q->configs.count : 0),
				      q->validate_only, simple_done, op);
		wipe_kv(kv, q->configs.count);
		return;
	}
	case KM_API_DELETE_MIRROR:
		km_state_delete_mirror(op->st, op->mirror, simple_done, op);
		return;
	case KM_API_LIST_MIRRORS:
		answer_list(op);
		return;
	case KM_API_DESCRIBE_MIRRORS:
		answer_describe(op);
		return;
	case KM_API_LAST_MIRRORED_OFFSETS:
		answer_lmo(op);
		return;
	default: {
		/* Only the topics the authorizer allowed go on. */
		size_t n;
		const char **allowed = pending_topics(op, &n);
		if (!allowed || !n) {
			answer_topics(op, 0, NULL, op->tcode, op->tmsg);
			return;
		}
		/* A start first has the destination topics there (created from the source when missing). */
		if (op->op == KM_TOPIC_START && op->mi) {
			km_mirror_prepare_start(op->mi, op->mirror, allowed, n, prepare_done, op);
			return;
		}
		km_state_topics(op->st, op->op, op->mirror, allowed, n, topics_done, op);
		return;
	}
	}
}

/* ---- the RPCs' hook ---- */

#define TOPIC_NAMES(op, q)                                                                               \
	do {                                                                                             \
		(op)->mirror = op_strdup((op), (q).mirror_name);                                         \
		(op)->ntopics = (q).topics.count > 0 ? (size_t)(q).topics.count : 0;                     \
		names = km_arena_calloc(&(op)->a, sizeof(km_str) * ((op)->ntopics + 1));                 \
		for (size_t i_ = 0; names && i_ < (op)->ntopics; i_++)                                   \
			names[i_] = (q).topics.items[i_].name;                                           \
	} while (0)

/* Check the request (names, duplicates): KM_OK, or the code with err. */
static km_err check_request(mop *op, char *err, size_t errlen)
{
	km_str *names = NULL;
	km_err rc;

	switch (op->key) {
	case KM_API_CREATE_MIRROR:
	case KM_API_ALTER_MIRROR: {
		/* Same layout: name, configs, validate_only. */
		const km_create_mirror_request *q = &op->m.create;
		op->mirror = op_strdup(op, q->mirror_name);
		if ((rc = km_mirror_check_name(q->mirror_name, "mirror", err, errlen)) != KM_OK)
			return rc;
		for (int32_t i = 0; i < q->configs.count; i++) {
			if (q->configs.items[i].name.len <= 0) {
				snprintf(err, errlen, "config %d has an empty name", (int)i);
				return KM_KAFKA_INVALID_REQUEST;
			}
			if (op->key == KM_API_CREATE_MIRROR && q->configs.items[i].value.len < 0) {
				snprintf(err, errlen, "config %.*s has no value", (int)q->configs.items[i].name.len,
					 q->configs.items[i].name.p);
				return KM_KAFKA_INVALID_REQUEST;
			}
			for (int32_t j = 0; j < i; j++)
				if (km_str_eq(q->configs.items[i].name, q->configs.items[j].name)) {
					snprintf(err, errlen, "config %.*s is given more than once",
						 (int)q->configs.items[i].name.len, q->configs.items[i].name.p);
					return KM_KAFKA_INVALID_REQUEST;
				}
		}
		return KM_OK;
	}
	case KM_API_DELETE_MIRROR:
		op->mirror = op_strdup(op, op->m.del.mirror_name);
		return km_mirror_check_name(op->m.del.mirror_name, "mirror", err, errlen);
	case KM_API_LIST_MIRRORS:
		return KM_OK;
	case KM_API_DESCRIBE_MIRRORS: {
		const km_describe_mirrors_request *q = &op->m.describe;
		if (q->mirror_names.count > 0 &&
		    (rc = km_mirror_check_names(q->mirror_names.items, (size_t)q->mirror_names.count, "mirror", err,
						errlen)) != KM_OK)
			return rc;
		if (q->topics.count > 0)
			return km_mirror_check_names(q->topics.items, (size_t)q->topics.count, "topic", err, errlen);
		return KM_OK;
	}
	case KM_API_LAST_MIRRORED_OFFSETS: {
		const km_last_mirrored_offsets_request *q = &op->m.lmo;
		op->mirror = op_strdup(op, q->mirror_name);
		if (q->mirror_name.len == 0) {
			/* Any mirror: each topic's own (a failback asks the kmirrord it mirrored into). */
			if (q->topics.count <= 0) {
				snprintf(err, errlen, "an empty mirror name needs the topics named");
				return KM_ERR_INVAL;
			}
		} else if ((rc = km_mirror_check_name(q->mirror_name, "mirror", err, errlen)) != KM_OK)
			return rc;
		if (q->topics.count <= 0)
			return KM_OK;
		names = km_arena_calloc(&op->a, sizeof(km_str) * (size_t)q->topics.count);
		for (int32_t i = 0; names && i < q->topics.count; i++)
			names[i] = q->topics.items[i].name;
		return names ? km_mirror_check_names(names, (size_t)q->topics.count, "topic", err, errlen) : KM_ERR_NOMEM;
	}
	case KM_API_START_MIRROR_TOPICS:
		op->op = KM_TOPIC_START;
		TOPIC_NAMES(op, op->m.start);
		break;
	case KM_API_STOP_MIRROR_TOPICS:
		op->op = KM_TOPIC_STOP;
		TOPIC_NAMES(op, op->m.stop);
		break;
	case KM_API_PAUSE_MIRROR_TOPICS:
		op->op = KM_TOPIC_PAUSE;
		TOPIC_NAMES(op, op->m.pause);
		break;
	default:
		op->op = KM_TOPIC_RESUME;
		TOPIC_NAMES(op, op->m.resume);
		break;
	}
	op->topics = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
	op->tcode = km_arena_calloc(&op->a, sizeof(int16_t) * (op->ntopics + 1));
	op->tmsg = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
	if (!names || !op->topics || !op->tcode || !op->tmsg)
		return KM_ERR_NOMEM;
	for (size_t i = 0; i < op->ntopics; i++)
		op->topics[i] = op_strdup(op, names[i]);
	if ((rc = km_mirror_check_name(km_str_c(op->mirror), "mirror", err, errlen)) != KM_OK)
		return rc;
	if (!op->ntopics) {
		snprintf(err, errlen, "no topics given");
		return KM_KAFKA_INVALID_REQUEST;
	}
	return km_mirror_check_names(names, op->ntopics, "topic", err, errlen);
}

static km_err mirror_request(km_req *rq)
{
	char err[400];
	km_err rc;
	mop *op = op_new(rq, &rc);

	if (!op) {
		/* A header the session's fixed-part check let through (a v1 header where v2 is due, say). */
		if (rc == KM_ERR_DECODE) {
			rq->close_reason = "malformed mirror request header";
			km_metrics_mirror_rpc_error(km_session_host_of(rq->s)->metrics, rq->h->api_key, KM_ERR_DECODE);
		}
		return rc;
	}
	op->now = rq;
	if (op_decode(op) != KM_OK) {
		/* What a broker does with a request it cannot parse. */
		count_error(op, KM_ERR_DECODE);
		op_free(op);
		rq->close_reason = "malformed mirror request";
		return KM_ERR_DECODE;
	}
	rc = check_request(op, err, sizeof(err));
	if (rc == KM_ERR_NOMEM) {
		op_free(op);
		return rc;
	}
	if (rc != KM_OK) {
		answer_error(op, rc, err);
		return KM_OK;
	}
	if (!op->st) {
		answer_error(op, KM_MIRROR_STATE_UNAVAILABLE, no_store_msg);
		return KM_OK;
	}
	if ((rc = authorize(rq, op)) != KM_OK) {
		op_free(op);
		return rc;
	}
	op->now = NULL;
	rq->pending = true;
	return KM_OK;
}

/* ---- mirror.name through IncrementalAlterConfigs and AlterConfigs ---- */

static const char *state_topic_of(const km_state *st)
{
	return st ? km_state_topic_name_of_store(st) : KM_MIRROR_STATE_TOPIC_DEFAULT;
}

static void cfg_answer(mop *op)
{
	if (op->key == KM_API_INCREMENTAL_ALTER_CONFIGS) {
		km_incremental_alter_configs_response r;
		if (km_mcfg_merge_iac(&op->m.iac, &op->sp, &op->a, &r) == KM_OK) {
			op_answer(op, &r);
			return;
		}
	} else {
		km_alter_configs_response r;
		if (km_mcfg_merge_ac(&op->m.ac, &op->sp, &op->a, &r) == KM_OK) {
			op_answer(op, &r);
			return;
		}
	}
	KM_WARN("proxy", op->sid, "out of memory answering a mirror.name change");
	op_free(op);
}

static km_str res_name(const mop *op, int32_t i)
{
	return op->key == KM_API_INCREMENTAL_ALTER_CONFIGS ? op->m.iac.resources.items[i].resource_name :
							     op->m.ac.resources.items[i].resource_name;
}

static void cfg_next(mop *op);

static void cfg_done(void *arg, const km_state_result *res)
{
	mop *op = arg;
	int32_t i = op->next_res - 1;
	km_err code = res->code ? res->code : res->ntopics ? res->topics[0].code : 0;
	const char *msg = res->code ? res->message : res->ntopics ? res->topics[0].message : NULL;
	km_mcfg_set(&op->sp, i, (int16_t)code, code ? (msg ? msg : km_err_message(code)) : NULL, &op->a);
	cfg_next(op);
}

/*
 * What resource i's mirror.name asks of the store: *top the operation, *mirror its mirror; false
 * when there is nothing to do (already so).
 */
static bool cfg_plan(mop *op, int32_t i, km_topic_op *top, const char **mirror, const km_state_topic **tp,
		     km_mp_state *state)
{
	const km_mcfg_res *r = &op->sp.res[i];
	km_str topic = res_name(op, i);
	const km_state_topic *t = km_state_topic_find(op->st, topic.p, (size_t)(topic.len > 0 ? topic.len : 0));
	const char *cur = t ? km_state_mirror_name(km_state_topic_mirror(t)) : NULL;
	km_mp_state s = t ? km_state_topic_state(t) : KM_MP_UNKNOWN;
	bool same;

	*mirror = r->mirror.len > 0 ? op_strdup(op, r->mirror) : cur;
	same = cur && *mirror && strcmp(cur, *mirror) == 0;
	*tp = t;
	*state = same ? s : KM_MP_UNKNOWN;
	switch (r->kind) {
	case KM_MCFG_SET:
		if (same && s == KM_MP_PAUSED) {
			*top = KM_TOPIC_RESUME;
			return true;
		}
		*top = KM_TOPIC_START;
		return !(same && (s == KM_MP_PREPARING || s == KM_MP_MIRRORING));
	case KM_MCFG_PAUSE:
		*top = KM_TOPIC_PAUSE;
		return !(same && (s == KM_MP_PAUSED || s == KM_MP_PAUSING));
	default:
		*top = KM_TOPIC_STOP;
		/* Deleting a config that is not there, or removing a stopped topic: nothing to do, as for any config. */
		if (!*mirror)
			return false;
		return !(same && (s == KM_MP_STOPPED || s == KM_MP_STOPPING));
	}
}

/* ValidateOnly: the checks the store would make, without making the change. */
static void cfg_validate(mop *op, int32_t i, km_topic_op top, const char *mirror, const km_state_topic *t,
			 km_mp_state state)
{
	km_str topic = res_name(op, i);
	km_err code = 0;
	char msg[500];

	if (!km_state_mirror_find(op->st, mirror)) {
		code = KM_MIRROR_UNKNOWN_CLUSTER_MIRROR;
		snprintf(msg, sizeof(msg), "mirror %s does not exist", mirror);
	} else if (t && state == KM_MP_UNKNOWN && top == KM_TOPIC_START &&
		   km_state_topic_state(t) != KM_MP_STOPPED) {
		code = KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR;
		snprintf(msg, sizeof(msg), "topic %.*s is already in mirror %s (%s)", (int)topic.len, topic.p,
			 km_state_mirror_name(km_state_topic_mirror(t)), km_mp_state_name(km_state_topic_state(t)));
	} else if (top != KM_TOPIC_START && state == KM_MP_UNKNOWN) {
		code = KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR;
		snprintf(msg, sizeof(msg), "topic %.*s is not in mirror %s", (int)topic.len, topic.p, mirror);
	} else if (!km_topic_op_allowed(top, state, &code)) {
		snprintf(msg, sizeof(msg), "cannot %s topic %.*s of mirror %s: it is %s", km_topic_op_name(top),
			 (int)topic.len, topic.p, mirror, km_mp_state_name(state));
	} else {
		code = 0;
	}
	km_mcfg_set(&op->sp, i, (int16_t)code, code ? msg : NULL, &op->a);
}

/* Carry out the mirror.name changes the broker authorized, one at a time, then answer. */
static void cfg_next(mop *op)
{
	while (op->next_res < op->sp.nres) {
		int32_t i = op->next_res++;
		const km_mcfg_res *r = &op->sp.res[i];
		const km_state_topic *t;
		km_topic_op top;
		const char *mirror, *topic;
		km_mp_state state;

		if (r->kind == KM_MCFG_NONE || r->code != 0)
			continue;
		if (!op->st) {
			km_mcfg_set(&op->sp, i, KM_MIRROR_STATE_UNAVAILABLE, no_store_msg, &op->a);
			continue;
		}
		if (!km_state_ready(op->st)) {
			km_mcfg_set(&op->sp, i, KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS, loading_msg, &op->a);
			continue;
		}
		if (!cfg_plan(op, i, &top, &mirror, &t, &state))
			continue;
		if (op->validate_only) {
			cfg_validate(op, i, top, mirror, t, state);
			continue;
		}
		topic = op_strdup(op, res_name(op, i));
		KM_INFO("proxy", op->sid, "%s=%.*s on topic %s: %s mirroring from %s", KM_MIRROR_NAME_CONFIG,
			(int)r->mirror.len, r->mirror.p, topic, km_topic_op_name(top), mirror);
		km_state_topics(op->st, top, mirror, &topic, 1, cfg_done, op);
		return; /* cfg_done goes on (op may be gone already) */
	}
	cfg_answer(op);
}

/* A probe of a config request answered: the broker's results become the resources' outcomes. */
static void cfg_probe_done(mop *op, km_err err, const uint8_t *body, size_t len, bool iac, bool auth)
{
	km_arena a;
	km_rd r;
	km_err rc;

	op->probes--;
	if (err != KM_OK)
		op->gone = true;
	if (!op->gone) {
		km_arena_init(&a, 0);
		km_rd_init(&r, body, len);
		if (iac) {
			km_incremental_alter_configs_response m;
			km_incremental_alter_configs_response_init(&m);
			rc = km_incremental_alter_configs_response_decode(&r, auth ? KM_PROBE_IAC_VERSION : op->version, &m, &a);
			if (rc == KM_OK)
				rc = km_mcfg_take_iac(&op->sp, &m, auth, &op->a);
		} else {
			km_alter_configs_response m;
			km_alter_configs_response_init(&m);
			rc = km_alter_configs_response_decode(&r, op->version, &m, &a);
			if (rc == KM_OK)
				rc = km_mcfg_take_ac(&op->sp, &m, &op->a);
		}
		km_arena_free(&a);
		if (rc != KM_OK) {
			KM_WARN("proxy", op->sid, "the broker's answer to a config change could not be read: %s",
				km_err_name(rc));
			for (int32_t i = 0; i < op->sp.nres; i++)
				km_mcfg_set(&op->sp, i, KM_KAFKA_UNKNOWN_SERVER_ERROR,
					    "the broker's answer could not be read", &op->a);
		}
	}
	if (op->probes > 0)
		return; /* the other probe still owes its answer */
	if (op->gone) {
		op_free(op);
		return;
	}
	cfg_next(op);
}

static void iac_fwd_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	mop *op = arg;
	cfg_probe_done(op, err, body, len, op->key == KM_API_INCREMENTAL_ALTER_CONFIGS, false);
}

static void ac_auth_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	cfg_probe_done(arg, err, body, len, true, true);
}

/* IncrementalAlterConfigs / AlterConfigs: the broker's unless mirror.name or the state topic is in it. */
static km_err config_request(km_req *rq)
{
	const km_session_host *host = km_session_host_of(rq->s);
	bool iac = rq->h->api_key == KM_API_INCREMENTAL_ALTER_CONFIGS;
	mop *op;
	km_err rc;

	op = op_new(rq, &rc);
	if (!op)
		return rc == KM_ERR_DECODE ? KM_OK : rc; /* the broker answers a header it cannot parse, as it always did */
	if (op_decode(op) != KM_OK) {
		op_free(op);
		return KM_OK; /* the broker answers what it cannot parse, as it always did */
	}
	rc = iac ? km_mcfg_split_iac(&op->m.iac, state_topic_of(host->state), &op->a, &op->sp) :
		   km_mcfg_split_ac(&op->m.ac, state_topic_of(host->state), &op->a, &op->sp);
	if (rc != KM_OK || !op->sp.mine) {
		op_free(op);
		return rc;
	}
	op->validate_only = iac ? op->m.iac.validate_only : op->m.ac.validate_only;
	op->now = rq;
	if (iac && op->sp.fwd.resources.count > 0)
		rc = send_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, op->version, &op->sp.fwd, iac_fwd_done);
	if (rc == KM_OK && !iac && op->sp.fwd_legacy.resources.count > 0)
		rc = send_probe(rq, op, KM_API_ALTER_CONFIGS, op->version, &op->sp.fwd_legacy, iac_fwd_done);
	if (rc == KM_OK && !iac && op->sp.auth.resources.count > 0)
		rc = send_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, KM_PROBE_IAC_VERSION, &op->sp.auth,
				ac_auth_done);
	if (rc != KM_OK) {
		/* A probe already sent reports the close (the session closes on this error) and frees op. */
		if (!op->probes)
			op_free(op);
		else
			op->now = NULL;
		return rc;
	}
	if (!op->probes) {
		/* Nothing for the broker: every resource was refused here. */
		cfg_answer(op);
		return KM_OK;
	}
	op->now = NULL;
	rq->pending = true;
	return KM_OK;
}

/* ---- DescribeConfigs: mirror.name shown on mirror topics ---- */

typedef struct describe_ctx {
	km_state *st;
	bool synonyms;
	size_t n;
	km_str *topics; /* copies */
	km_arena a;
} describe_ctx;

static void describe_ctx_free(void *p)
{
	describe_ctx *c = p;
	km_arena_free(&c->a);
	free(c);
}

static bool describe_lookup(void *arg, km_str topic, char *value, size_t cap)
{
	describe_ctx *c = arg;
	const km_state_topic *t = km_state_topic_find(c->st, topic.p, (size_t)(topic.len > 0 ? topic.len : 0));
	const char *suffix = "";
	if (!t)
		return false;
	switch (km_state_topic_state(t)) {
	case KM_MP_PAUSED:
	case KM_MP_PAUSING:
		suffix = KM_MIRROR_PAUSED_SUFFIX;
		break;
	case KM_MP_STOPPED:
	case KM_MP_STOPPING:
		suffix = KM_MIRROR_REMOVED_SUFFIX;
		break;
	default:
		break;
	}
	snprintf(value, cap, "%s%s", km_state_mirror_name(km_state_topic_mirror(t)), suffix);
	return true;
}

static km_err describe_response(km_resp *rs)
{
	describe_ctx *c = rs->ctx;
	const km_api_info *api = km_api_lookup(KM_API_DESCRIBE_CONFIGS);
	size_t end = rs->frame_len + 4;
	uint8_t *frame = evbuffer_pullup(rs->in, (ev_ssize_t)end), pre[4];
	km_describe_configs_response m;
	km_wr w, out;
	km_rd r;
	km_arena a;
	km_err rc;
	int added = 0;

	if (!frame)
		return KM_ERR_NOMEM;
	/* The proxy's own rewriting first (broker listeners), then the addition. */
	km_wr_init(&w);
	rc = km_rewrite_describe_configs(frame + rs->body_off, end - rs->body_off, rs->version, rs->rw, &w);
	if (rc != KM_OK) {
		km_wr_free(&w);
		return rc;
	}
	km_arena_init(&a, 0);
	km_rd_init(&r, w.buf, w.len);
	api->response.init(&m);
	rc = api->response.decode(&r, rs->version, &m, &a);
	if (rc == KM_OK)
		rc = km_mcfg_describe_add(&m, c->topics, c->n, c->synonyms, describe_lookup, c, &a, &added);
	km_wr_init(&out);
	km_wr_raw(&out, frame + 4, rs->body_off - 4); /* correlation id and header tags */
	if (rc == KM_OK && added)
		api->response.encode(&out, rs->version, &m);
	else if (rc == KM_OK)
		km_wr_raw(&out, w.buf, w.len);
	if (rc == KM_OK && (!km_wr_ok(&out) || out.len > INT32_MAX))
		rc = KM_ERR_NOMEM;
	if (rc == KM_OK) {
		km_put_be32(pre, (uint32_t)out.len);
		evbuffer_add(rs->out, pre, 4);
		evbuffer_add(rs->out, out.buf, out.len);
		evbuffer_drain(rs->in, end);
	}
	km_wr_free(&out);
	km_wr_free(&w);
	km_arena_free(&a);
	return rc;
}

static km_err describe_request(km_req *rq)
{
	km_state *st = km_session_host_of(rq->s)->state;
	const km_api_info *api = km_api_lookup(KM_API_DESCRIBE_CONFIGS);
	km_describe_configs_request m;
	describe_ctx *c;
	km_arena a;
	km_rd r;

	size_t off;

	if (!st || !km_state_ready(st) || !km_state_mirror_count(st) || !body_offset(rq, &off))
		return KM_OK; /* nothing to add: forwarded as it is */
	km_arena_init(&a, 0);
	km_rd_init(&r, rq->body + off, rq->frame_len - off);
	api->request.init(&m);
	if (api->request.decode(&r, rq->h->api_version, &m, &a) != KM_OK || !(c = calloc(1, sizeof(*c)))) {
		km_arena_free(&a);
		return KM_OK; /* the broker answers what it cannot parse */
	}
	km_arena_init(&c->a, 0);
	c->st = st;
	c->synonyms = m.include_synonyms;
	c->topics = km_arena_calloc(&c->a, sizeof(km_str) * ((size_t)(m.resources.count > 0 ? m.resources.count : 0) + 1));
	for (int32_t i = 0; c->topics && i < m.resources.count; i++) {
		const km_describe_configs_request_describe_configs_resource *res = &m.resources.items[i];
		char *p;
		if (!km_mcfg_describe_wants(res) ||
		    !km_state_topic_find(st, res->resource_name.p, (size_t)(res->resource_name.len > 0 ? res->resource_name.len : 0)))
			continue;
		p = km_arena_alloc(&c->a, (size_t)res->resource_name.len + 1);
		if (!p)
			break;
		memcpy(p, res->resource_name.p, (size_t)res->resource_name.len);
		c->topics[c->n++] = (km_str){p, res->resource_name.len};
	}
	km_arena_free(&a);
	if (!c->n) {
		describe_ctx_free(c);
		return KM_OK;
	}
	rq->ctx = c;
	rq->ctx_free = describe_ctx_free;
	rq->on_response = describe_response;
	return KM_OK;
}

/* ---- the stages ---- */

/* A mirror RPC: answered here (later, once the store has done its work), never forwarded. */
#define MIRROR_RPC(k, n)                                                                                              \
	{.key = (k), .versions = true, .min_version = 0, .max_version = 0, .req = KM_REQ_LOCAL,                       \
	 .on_request = mirror_request, .resp = KM_RESP_LOCAL, .note = (n)}

static const km_proxy_stage stages[] = {
	{.key = KM_API_DESCRIBE_CONFIGS, .req = KM_REQ_HOLD, .on_request = describe_request,
	 .note = "mirror topics show mirror.name"},
	{.key = KM_API_ALTER_CONFIGS, .req = KM_REQ_HOLD, .on_request = config_request,
	 .note = "mirror.name on a topic is a mirror operation (the rest forwarded without it); __mirror_state refused"},
	{.key = KM_API_INCREMENTAL_ALTER_CONFIGS, .req = KM_REQ_HOLD, .on_request = config_request,
	 .note = "mirror.name on a topic is a mirror operation (the rest forwarded without it); __mirror_state refused"},
	MIRROR_RPC(KM_API_CREATE_MIRROR, "authorized as ALTER_CONFIGS on CLUSTER, then the store creates the mirror"),
	MIRROR_RPC(KM_API_DELETE_MIRROR, "authorized as ALTER_CONFIGS on CLUSTER, then the store deletes the mirror"),
	MIRROR_RPC(KM_API_LIST_MIRRORS, "authorized as DESCRIBE_CONFIGS on CLUSTER; answered from the store"),
	MIRROR_RPC(KM_API_DESCRIBE_MIRRORS,
		   "authorized as DESCRIBE_CONFIGS on CLUSTER; answered from the store (secrets masked)"),
	MIRROR_RPC(KM_API_ALTER_MIRROR, "authorized as ALTER_CONFIGS on CLUSTER, then the store changes the options"),
	MIRROR_RPC(KM_API_START_MIRROR_TOPICS, "authorized as ALTER_CONFIGS on each topic, then the store starts them"),
	MIRROR_RPC(KM_API_STOP_MIRROR_TOPICS, "authorized as ALTER_CONFIGS on each topic, then the store stops them"),
	MIRROR_RPC(KM_API_PAUSE_MIRROR_TOPICS, "authorized as ALTER_CONFIGS on each topic, then the store pauses them"),
	MIRROR_RPC(KM_API_RESUME_MIRROR_TOPICS,
		   "authorized as ALTER_CONFIGS on each topic, then the store resumes them"),
	MIRROR_RPC(KM_API_LAST_MIRRORED_OFFSETS, "authorized as DESCRIBE_CONFIGS on CLUSTER; answered from the store"),
};

const km_proxy_feature km_mirror_rpc_feature = {"mirror-rpc", stages, sizeof(stages) / sizeof(stages[0])};
