/* The mirror RPCs and the mirror.name topic config: checked here, authorized by the destination's broker as the caller, carried out by the state store. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "kmirror/api.h"
#include "kmirror/clock.h"
#include "kmirror/log.h"
#include "kmirror/mirror.h"
#include "kmirror/net.h"
#include "kmirror/msg/alter_mirror_request.h"
#include "kmirror/msg/alter_mirror_response.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_mirror_request.h"
#include "kmirror/msg/create_mirror_response.h"
#include "kmirror/msg/create_topics_request.h"
#include "kmirror/msg/create_topics_response.h"
#include "kmirror/msg/delete_acls_request.h"
#include "kmirror/msg/delete_acls_response.h"
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
#include "proxy/mirror_rpc_int.h"
#include "proxy/rewrite.h"


const char km_mop_no_store_msg[] = "kmirrord has no state store: mirror operations are not available";
const char km_mop_loading_msg[] = "mirror state is loading";


static km_mop *live_ops;

void km_mirror_rpc_detach(km_session_set *set)
{
	for (km_mop *op = live_ops; op; op = op->next)
		if (op->set == set)
			op->set = NULL;
}

void km_mop_free(km_mop *op)
{
	if (op->prev)
		op->prev->next = op->next;
	else if (live_ops == op)
		live_ops = op->next;
	if (op->next)
		op->next->prev = op->prev;
	if (op->fresh_ev)
		event_free(op->fresh_ev);
	km_arena_free(&op->a);
	if (op->req && (op->key == KM_API_CREATE_MIRROR || op->key == KM_API_ALTER_MIRROR))
		OPENSSL_cleanse(op->req, op->req_len); /* it holds the configuration in clear, secrets included */
	free(op->req);
	free(op);
}

/* Where the request's body starts: the session reads only the fixed part of the header. */
bool km_mop_body_offset(const km_req *rq, size_t *off)
{
	km_req_header h;
	int hv = km_proxy_request_header_version(rq->h->api_key, rq->h->api_version);
	if (hv < 0 || km_net_parse_request_header(rq->body, rq->frame_len, hv, &h) != KM_OK)
		return false;
	*off = h.body_offset;
	return true;
}

/* NULL with *rc: KM_ERR_DECODE when the request header cannot be parsed, else KM_ERR_NOMEM. */
km_mop *km_mop_new(km_req *rq, km_err *rc)
{
	const km_session_host *host = km_session_host_of(rq->s);
	size_t off;
	km_mop *op;
	*rc = KM_ERR_DECODE;
	if (!km_mop_body_offset(rq, &off))
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
	op->base = host->base;
	if (op->st) {
		op->fresh_ticket = km_state_follow_ticket(op->st);
		op->fresh_until = km_mono_ms() + KM_MOP_FRESH_WAIT_MS;
	}
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

const char *km_mop_strdup(km_mop *op, km_str s)
{
	char *p = km_arena_alloc(&op->a, (size_t)(s.len > 0 ? s.len : 0) + 1);
	if (!p)
		return "";
	if (s.len > 0)
		memcpy(p, s.p, (size_t)s.len);
	p[s.len > 0 ? s.len : 0] = '\0';
	return p;
}

static const char *op_printf(km_mop *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *op_printf(km_mop *op, const char *fmt, ...)
{
	char buf[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return km_mop_strdup(op, km_str_c(buf));
}

static km_str cstr(const char *s)
{
	return s ? km_str_c(s) : KM_STR_NULL;
}

/* Decode the copied request with the codec of its key. */
km_err km_mop_decode(km_mop *op)
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
static void count_error(const km_mop *op, int code)
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
void km_mop_answer(km_mop *op, const void *resp)
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
	km_mop_free(op);
}

/* Topic operations' four responses have one layout: one answer function per RPC, from one macro. */
#define TOPICS_ANSWER(fn, TYPE)                                                                                \
	static void fn(km_mop *op, km_err code, const char *msg, const int16_t *tcodes, const char *const *tmsgs) \
	{                                                                                                      \
		TYPE r;                                                                                        \
		TYPE##_init(&r);                                                                               \
		r.error_code = (int16_t)code;                                                                  \
		r.error_message = code ? cstr(msg) : KM_STR_NULL;                                              \
		r.mirror_name = cstr(op->mirror);                                                              \
		r.topics.count = (int32_t)op->ntopics;                                                         \
		r.topics.items = km_arena_calloc(&op->a, sizeof(*r.topics.items) * (op->ntopics + 1));         \
		for (size_t i_ = 0; r.topics.items && i_ < op->ntopics; i_++) {                                \
			TYPE##_topic_result_init(&r.topics.items[i_]);                                         \
			r.topics.items[i_].name = km_str_c(op->topics[i_]);                                    \
			r.topics.items[i_].error_code = tcodes[i_];                                            \
			r.topics.items[i_].error_message = tcodes[i_] ? cstr(tmsgs[i_]) : KM_STR_NULL;         \
		}                                                                                              \
		if (!r.topics.items)                                                                           \
			r.topics.count = 0;                                                                    \
		km_mop_answer(op, &r);                                                                             \
	}

TOPICS_ANSWER(start_answer, km_start_mirror_topics_response)
TOPICS_ANSWER(stop_answer, km_stop_mirror_topics_response)
TOPICS_ANSWER(pause_answer, km_pause_mirror_topics_response)
TOPICS_ANSWER(resume_answer, km_resume_mirror_topics_response)

/* Answer a topic operation with per-topic outcomes (and a top-level code). */
static void answer_topics(km_mop *op, km_err code, const char *msg, const int16_t *tcodes, const char *const *tmsgs)
{
	/* One count for a request refused as a whole, else one per refused topic. */
	if (code)
		count_error(op, code);
	for (size_t i = 0; !code && i < op->ntopics; i++)
		count_error(op, tcodes[i]);
	op->rpc->topics(op, code, msg, tcodes, tmsgs);
}

/* A topic operation's error answer: every topic gets the error too. */
static void topics_error(km_mop *op, km_err code, const char *msg)
{
	int16_t *codes = km_arena_calloc(&op->a, sizeof(int16_t) * (op->ntopics + 1));
	const char **msgs = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
	for (size_t i = 0; codes && msgs && i < op->ntopics; i++) {
		codes[i] = (int16_t)code;
		msgs[i] = msg;
	}
	if (!codes || !msgs)
		op->ntopics = 0;
	answer_topics(op, code, msg, codes, msgs);
}

/* The other RPCs' error answers: an error code and message (and an empty list), one function each. */
#define ERROR_ANSWER(fn, TYPE, empty)                                                                          \
	static void fn(km_mop *op, km_err code, const char *msg)                                                  \
	{                                                                                                      \
		TYPE r;                                                                                        \
		count_error(op, code);                                                                         \
		memset(&r, 0, sizeof(r));                                                                      \
		TYPE##_init(&r);                                                                               \
		r.error_code = (int16_t)code;                                                                  \
		r.error_message = cstr(msg);                                                                   \
		empty;                                                                                         \
		km_mop_answer(op, &r);                                                                             \
	}

ERROR_ANSWER(create_error, km_create_mirror_response, (void)0)
ERROR_ANSWER(delete_error, km_delete_mirror_response, (void)0)
ERROR_ANSWER(alter_error, km_alter_mirror_response, (void)0)
ERROR_ANSWER(list_error, km_list_mirrors_response, r.mirrors.count = 0)
ERROR_ANSWER(describe_error, km_describe_mirrors_response, r.mirrors.count = 0)
ERROR_ANSWER(lmo_error, km_last_mirrored_offsets_response, r.topics.count = 0)

static void answer_error(km_mop *op, km_err code, const char *msg)
{
	op->rpc->error(op, code, msg);
}

/* ---- authorization: a validate-only request on the caller's own upstream connection ---- */

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

km_err km_mop_probe(km_req *rq, km_mop *op, int16_t key, int16_t version, const void *m, km_session_probe_cb cb)
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

static void proceed(km_mop *op);

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

/* The CREATE probe's verdict on topic, by name as for probe_result, or NULL. */
static const km_create_topics_response_creatable_topic_result *create_result(const km_create_topics_response *m,
									    const char *topic)
{
	for (int32_t k = 0; k < m->topics.count; k++)
		if (km_str_eq_c(m->topics.items[k].name, topic))
			return &m->topics.items[k];
	return NULL;
}

/* A refusal of the whole request: the first one found is the answer (the probes answer in the order sent). */
static void auth_refuse(km_mop *op, int16_t code, const char *msg)
{
	if (!op->auth_code) {
		op->auth_code = code;
		op->auth_msg = msg;
	}
}

static void auth_unreadable(km_mop *op)
{
	auth_refuse(op, KM_KAFKA_UNKNOWN_SERVER_ERROR, "the authorization check's response could not be read");
}

/* A probe's error other than a refusal: the check did not pass, so it is the answer. */
static const char *check_failed(km_mop *op, int16_t code, km_str msg)
{
	return op_printf(op, "authorization check failed: %s: %.*s", km_err_name(code), msg.len > 0 ? (int)msg.len : 0,
			 msg.len > 0 ? msg.p : "");
}

/*
 * All probes answered: a refusal of the whole request is the answer; a start's missing topics take
 * the CREATE probe's verdict (kmirrord would create them); the rest goes on to the store.
 */
static void auth_verdict(km_mop *op)
{
	if (op->auth_code) {
		answer_error(op, op->auth_code, op->auth_msg);
		return;
	}
	for (size_t i = 0; op->tmissing && i < op->ntopics; i++)
		if (op->tmissing[i] && !op->tcode[i] && op->ccode[i]) {
			op->tcode[i] = op->ccode[i];
			op->tmsg[i] = op->cmsg[i];
		}
	proceed(op);
}

/*
 * One probe answered. Nothing is answered or freed before the last one has (each holds op as its
 * argument); a session gone reports KM_ERR_CLOSED to every probe, and the last frees op.
 */
static void auth_join(km_mop *op, km_err err)
{
	op->probes--;
	if (err != KM_OK)
		op->gone = true;
	if (op->probes > 0)
		return; /* another probe still owes its answer */
	if (op->gone) {
		km_mop_free(op); /* the session is gone: nothing to answer */
		return;
	}
	auth_verdict(op);
}

/* The cluster probe (IncrementalAlterConfigs or DescribeConfigs of BROKER ""): one verdict for the request. */
static void cluster_probe_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	km_mop *op = arg;
	bool alter = op->rpc->auth == KM_MOP_AUTH_CLUSTER_ALTER;
	km_arena a;
	km_rd r;
	int16_t code = 0;
	km_str msg = KM_STR_NULL;
	bool unreadable = false;

	if (err != KM_OK || op->gone) {
		auth_join(op, err);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&r, body, len);
	if (!alter) {
		km_describe_configs_response m;
		km_describe_configs_response_init(&m);
		unreadable = km_describe_configs_response_decode(&r, KM_PROBE_DESCRIBE_VERSION, &m, &a) != KM_OK ||
			     m.results.count != 1;
		if (!unreadable) {
			code = m.results.items[0].error_code;
			msg = m.results.items[0].error_message;
		}
	} else {
		km_incremental_alter_configs_response m;
		km_incremental_alter_configs_response_init(&m);
		unreadable = km_incremental_alter_configs_response_decode(&r, KM_PROBE_IAC_VERSION, &m, &a) != KM_OK ||
			     m.responses.count != 1;
		if (!unreadable) {
			code = m.responses.items[0].error_code;
			msg = m.responses.items[0].error_message;
		}
	}
	if (unreadable)
		auth_unreadable(op);
	else if (code == KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED)
		auth_refuse(op, code,
			    alter ? "not authorized to change mirrors: the destination's authorizer refused ALTER_CONFIGS "
				    "on the cluster" :
				    "not authorized to describe mirrors: the destination's authorizer refused "
				    "DESCRIBE_CONFIGS on the cluster");
	else if (code != 0)
		auth_refuse(op, code, check_failed(op, code, msg));
	km_arena_free(&a);
	auth_join(op, err);
}

/* The topic probe's verdict on each topic: refusals are that topic's answer; the other topics go on. */
static void topics_verdict(km_mop *op, const km_incremental_alter_configs_response *m)
{
	for (size_t i = 0; i < op->ntopics; i++) {
		/*
		 * By name, never by position: the broker answers refused resources first and the rest in
		 * its own map's order, so position i may be another topic's verdict.
		 */
		const km_incremental_alter_configs_response_alter_configs_resource_response *x =
			probe_result(m, op->topics[i]);
		if (!x) {
			auth_unreadable(op);
			return;
		}
		/*
		 * An unknown topic got past the authorizer: it is the store's to judge (start needs the
		 * topic, stop of a deleted one does not), or, for a start, the CREATE probe's (kmirrord
		 * creates it). Any other error means the check did not pass, so the topic is refused with
		 * it: never acted on unchecked.
		 */
		if (x->error_code == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION && op->tmissing)
			op->tmissing[i] = true;
		if (x->error_code == 0 || x->error_code == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION)
			continue;
		if (x->error_code == KM_KAFKA_TOPIC_AUTHORIZATION_FAILED ||
		    x->error_code == KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED) {
			op->tcode[i] = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
			op->tmsg[i] = op_printf(op,
						"not authorized to %s mirroring of topic %s: the destination's authorizer "
						"refused ALTER_CONFIGS on the topic",
						km_topic_op_name(op->op), op->topics[i]);
		} else {
			op->tcode[i] = x->error_code;
			op->tmsg[i] = op_printf(op, "cannot %s mirroring of topic %s: the authorization check failed: %s: %.*s",
						km_topic_op_name(op->op), op->topics[i], km_err_name(x->error_code),
						x->error_message.len > 0 ? (int)x->error_message.len : 0,
						x->error_message.len > 0 ? x->error_message.p : "");
		}
	}
}

/* The topic probe (IncrementalAlterConfigs of each topic): ALTER_CONFIGS on each, which the config sync needs too. */
static void topics_probe_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	km_mop *op = arg;
	km_incremental_alter_configs_response m;
	km_arena a;
	km_rd r;

	if (err != KM_OK || op->gone) {
		auth_join(op, err);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&r, body, len);
	km_incremental_alter_configs_response_init(&m);
	if (km_incremental_alter_configs_response_decode(&r, KM_PROBE_IAC_VERSION, &m, &a) != KM_OK ||
	    m.responses.count != (int32_t)op->ntopics)
		auth_unreadable(op);
	else
		topics_verdict(op, &m);
	km_arena_free(&a);
	auth_join(op, err);
}

/*
 * Errors a CreateTopics gives only once the authorizer has allowed CREATE (the controller checks
 * authorization first, then the name, the partitions, the replicas, the configs and the policy):
 * the CREATE check passed; whether kmirrord's own creation works is the preparation's to say.
 */
static bool past_create_authorizer(int16_t code)
{
	switch (code) {
	case KM_KAFKA_NONE:
	case KM_KAFKA_INVALID_TOPIC_EXCEPTION:
	case KM_KAFKA_TOPIC_ALREADY_EXISTS:
	case KM_KAFKA_INVALID_PARTITIONS:
	case KM_KAFKA_INVALID_REPLICATION_FACTOR:
	case KM_KAFKA_INVALID_REPLICA_ASSIGNMENT:
	case KM_KAFKA_INVALID_CONFIG:
	case KM_KAFKA_POLICY_VIOLATION:
		return true;
	default:
		return false;
	}
}

/*
 * The CREATE probe (CreateTopics, ValidateOnly, every topic of a start): recorded for each topic,
 * used only for those the topic probe finds missing (auth_verdict). The broker judges CREATE before
 * existence, so an existing topic's verdict here says nothing about this start.
 */
static void create_probe_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	km_mop *op = arg;
	km_create_topics_response m;
	km_arena a;
	km_rd r;

	if (err != KM_OK || op->gone) {
		auth_join(op, err);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&r, body, len);
	km_create_topics_response_init(&m);
	if (km_create_topics_response_decode(&r, KM_PROBE_CREATE_VERSION, &m, &a) != KM_OK)
		auth_unreadable(op);
	for (size_t i = 0; !op->auth_code && i < op->ntopics; i++) {
		const km_create_topics_response_creatable_topic_result *x = create_result(&m, op->topics[i]);
		if (!x) {
			auth_unreadable(op);
		} else if (x->error_code == KM_KAFKA_TOPIC_AUTHORIZATION_FAILED ||
			   x->error_code == KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED) {
			op->ccode[i] = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
			op->cmsg[i] = op_printf(op,
						"not authorized to start mirroring of topic %s: it does not exist on the "
						"destination and the destination's authorizer refused CREATE (kmirrord "
						"would create it)",
						op->topics[i]);
		} else if (!past_create_authorizer(x->error_code)) {
			op->ccode[i] = x->error_code;
			op->cmsg[i] = op_printf(op,
						"cannot start mirroring of topic %s: it does not exist on the destination "
						"and the CREATE authorization check failed: %s: %.*s",
						op->topics[i], km_err_name(x->error_code),
						x->error_message.len > 0 ? (int)x->error_message.len : 0,
						x->error_message.len > 0 ? x->error_message.p : "");
		}
	}
	km_arena_free(&a);
	auth_join(op, err);
}

/* The ACL probe (DeleteAcls of a binding that does not exist): ALTER on CLUSTER, which the ACL sync needs. */
static void acl_probe_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	km_mop *op = arg;
	km_delete_acls_response m;
	km_arena a;
	km_rd r;

	if (err != KM_OK || op->gone) {
		auth_join(op, err);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&r, body, len);
	km_delete_acls_response_init(&m);
	if (km_delete_acls_response_decode(&r, KM_PROBE_ACL_VERSION, &m, &a) != KM_OK || m.filter_results.count != 1) {
		auth_unreadable(op);
	} else {
		const km_delete_acls_response_delete_acls_filter_result *x = &m.filter_results.items[0];
		if (x->error_code == KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED)
			auth_refuse(op, x->error_code,
				    op_printf(op,
					      "not authorized to sync ACLs: with mirror.acl.include=%s the mirror's ACL "
					      "sync creates and deletes ACLs on the destination, and the destination's "
					      "authorizer refused ALTER on the cluster (what CreateAcls and DeleteAcls need)",
					      op->acl_scope));
		/* No authorizer: every check passes, as the other probes' do (the ACL sync then does nothing). */
		else if (x->error_code != 0 && x->error_code != KM_KAFKA_SECURITY_DISABLED)
			auth_refuse(op, x->error_code, check_failed(op, x->error_code, x->error_message));
		else if (x->matching_acls.count > 0)
			KM_WARN("proxy", op->sid, "the ACL authorization probe deleted %d binding(s) named %s",
				(int)x->matching_acls.count, KM_PROBE_ACL_RESOURCE);
	}
	km_arena_free(&a);
	auth_join(op, err);
}

/* ALTER_CONFIGS on CLUSTER: IncrementalAlterConfigs, ValidateOnly, of BROKER "" with no configs. */
static km_err probe_cluster_alter(km_req *rq, km_mop *op)
{
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
	return km_mop_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, KM_PROBE_IAC_VERSION, &m, cluster_probe_done);
}

/* DESCRIBE_CONFIGS on CLUSTER: DescribeConfigs of one key of BROKER "". */
static km_err probe_cluster_describe(km_req *rq, km_mop *op)
{
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
	return km_mop_probe(rq, op, KM_API_DESCRIBE_CONFIGS, KM_PROBE_DESCRIBE_VERSION, &m, cluster_probe_done);
}

/* ALTER_CONFIGS on each topic: IncrementalAlterConfigs, ValidateOnly, one TOPIC resource per topic. */
static km_err probe_topics(km_req *rq, km_mop *op)
{
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
	return km_mop_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, KM_PROBE_IAC_VERSION, &m, topics_probe_done);
}

/* CREATE on each topic of a start: CreateTopics, ValidateOnly, broker defaults for partitions and replicas. */
static km_err probe_create(km_req *rq, km_mop *op)
{
	km_create_topics_request m;
	km_create_topics_request_creatable_topic *ts = km_arena_calloc(&op->a, sizeof(*ts) * (op->ntopics + 1));
	op->tmissing = km_arena_calloc(&op->a, sizeof(bool) * (op->ntopics + 1));
	op->ccode = km_arena_calloc(&op->a, sizeof(int16_t) * (op->ntopics + 1));
	op->cmsg = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
	if (!ts || !op->tmissing || !op->ccode || !op->cmsg) {
		op->tmissing = NULL; /* the topic probe may be out already: it must not mark what is not there */
		return KM_ERR_NOMEM;
	}
	km_create_topics_request_init(&m);
	for (size_t i = 0; i < op->ntopics; i++) {
		km_create_topics_request_creatable_topic_init(&ts[i]);
		ts[i].name = km_str_c(op->topics[i]);
		ts[i].num_partitions = -1;
		ts[i].replication_factor = -1;
		ts[i].assignments.count = 0;
		ts[i].configs.count = 0;
	}
	m.topics.count = (int32_t)op->ntopics;
	m.topics.items = ts;
	/* A controller gives up on a request past its timeout: 0 could time out even a validation. */
	m.timeout_ms = KM_PROBE_CREATE_TIMEOUT_MS;
	m.validate_only = true;
	return km_mop_probe(rq, op, KM_API_CREATE_TOPICS, KM_PROBE_CREATE_VERSION, &m, create_probe_done);
}

/*
 * ALTER on CLUSTER: DeleteAcls with one filter that matches nothing real. The broker checks ALTER
 * on CLUSTER before looking at the filter (CLUSTER_AUTHORIZATION_FAILED without it). It deletes
 * nothing: a LITERAL filter with a name matches only a LITERAL binding of exactly that name (no
 * wildcard, no prefix), and with a principal, an operation and a permission only a binding with
 * exactly those; the only binding that could match is a DENY of ALTER on a topic named
 * KM_PROBE_ACL_RESOURCE for a principal no one logs in as.
 */
static km_err probe_acl_alter(km_req *rq, km_mop *op)
{
	km_delete_acls_request m;
	km_delete_acls_request_delete_acls_filter f;
	km_delete_acls_request_init(&m);
	km_delete_acls_request_delete_acls_filter_init(&f);
	f.resource_type_filter = KM_RESOURCE_TOPIC;
	f.resource_name_filter = km_str_c(KM_PROBE_ACL_RESOURCE);
	f.pattern_type_filter = KM_ACL_PATTERN_LITERAL;
	f.principal_filter = km_str_c(KM_PROBE_ACL_PRINCIPAL);
	f.host_filter = km_str_c("*");
	f.operation = KM_ACL_OPERATION_ALTER;
	f.permission_type = KM_ACL_PERMISSION_DENY;
	m.filters.count = 1;
	m.filters.items = &f;
	return km_mop_probe(rq, op, KM_API_DELETE_ACLS, KM_PROBE_ACL_VERSION, &m, acl_probe_done);
}

/* A CreateMirror's or AlterMirror's mirror.acl.include, when the mirror would sync ACLs with it; else NULL. */
static const char *acl_sync_scope(km_mop *op)
{
	const km_create_mirror_request *q = &op->m.create; /* alter has the same layout */
	const km_state_mirror *mi;
	km_mirror_options o;
	const char *scope = NULL;

	for (int32_t i = 0; i < q->configs.count; i++)
		if (km_str_eq_c(q->configs.items[i].name, KM_MIRROR_ACL_INCLUDE))
			/* Alter: a NULL value removes the key, back to the default (off). */
			return q->configs.items[i].value.len > 0 ? km_mop_strdup(op, q->configs.items[i].value) : NULL;
	/* Not given: create takes the default (off); alter keeps what the mirror has (not loaded yet: the store refuses). */
	if (op->key != KM_API_ALTER_MIRROR || !km_state_ready(op->st) || !(mi = km_state_mirror_find(op->st, op->mirror)))
		return NULL;
	if (km_state_mirror_options(mi, &o) != KM_OK)
		return KM_MIRROR_ACL_INCLUDE; /* unreadable options: checked rather than not */
	if (o.acl_include && *o.acl_include)
		scope = km_mop_strdup(op, km_str_c(o.acl_include));
	km_opt_free(km_state_mirror_option_table(), &o);
	return scope;
}

/* Send every probe the RPC needs, all from here (the request's hook): each effect kmirrord would cause is checked. */
static km_err authorize(km_req *rq, km_mop *op)
{
	km_err rc;
	switch (op->rpc->auth) {
	case KM_MOP_AUTH_CLUSTER_ALTER:
		rc = probe_cluster_alter(rq, op);
		/* The ACL sync creates and deletes ACLs as kmirrord: the caller needs what that needs. */
		if (rc == KM_OK && op->key != KM_API_DELETE_MIRROR && (op->acl_scope = acl_sync_scope(op)))
			rc = probe_acl_alter(rq, op);
		return rc;
	case KM_MOP_AUTH_CLUSTER_DESCRIBE:
		return probe_cluster_describe(rq, op);
	default:
		rc = probe_topics(rq, op);
		/* A start creates the topics the destination lacks, as kmirrord: the caller needs CREATE. */
		if (rc == KM_OK && op->op == KM_TOPIC_START && op->mi)
			rc = probe_create(rq, op);
		return rc;
	}
}

/* ---- the store ---- */

static void simple_done(void *arg, const km_state_result *res)
{
	km_mop *op = arg;
	answer_error(op, res->code, res->code ? (res->message ? res->message : km_err_message(res->code)) : NULL);
}

static void topics_done(void *arg, const km_state_result *res)
{
	km_mop *op = arg;
	size_t k = 0;
	/* The store answered the authorized topics, in order; the refused ones keep their refusal. */
	for (size_t i = 0; i < op->ntopics; i++) {
		if (op->tcode[i])
			continue;
		if (k < res->ntopics) {
			op->tcode[i] = (int16_t)res->topics[k].code;
			op->tmsg[i] = res->topics[k].code ?
					      km_mop_strdup(op, cstr(res->topics[k].message ? res->topics[k].message :
											 km_err_message(res->topics[k].code))) :
					      NULL;
		} else if (res->code) {
			op->tcode[i] = (int16_t)res->code;
			op->tmsg[i] = km_mop_strdup(op, cstr(res->message ? res->message : km_err_message(res->code)));
		}
		k++;
	}
	answer_topics(op, res->code,
		      res->code ? km_mop_strdup(op, cstr(res->message ? res->message : km_err_message(res->code))) : NULL,
		      op->tcode, op->tmsg);
}

/* The topics still unanswered (authorized, not refused by the preparation), for the store. */
static const char **pending_topics(km_mop *op, size_t *n)
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
	km_mop *op = arg;
	const char **allowed;
	size_t k = 0, n;

	for (size_t i = 0; i < op->ntopics; i++) {
		if (op->tcode[i])
			continue;
		if (code) {
			op->tcode[i] = (int16_t)code;
			op->tmsg[i] = km_mop_strdup(op, cstr(message ? message : km_err_message(code)));
		} else if (k < nres && res[k].code) {
			op->tcode[i] = (int16_t)res[k].code;
			op->tmsg[i] = km_mop_strdup(op, cstr(res[k].message ? res[k].message : km_err_message(res[k].code)));
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

static km_state_kv *config_kv(km_mop *op, const void *items, int32_t count, size_t stride)
{
	km_state_kv *kv = km_arena_calloc(&op->a, sizeof(*kv) * ((size_t)(count > 0 ? count : 0) + 1));
	for (int32_t i = 0; kv && i < count; i++) {
		/* Create and alter configs share one layout: name, then value. */
		const km_str *f = (const km_str *)((const uint8_t *)items + (size_t)i * stride);
		kv[i].name = km_mop_strdup(op, f[0]);
		kv[i].value = f[1].len < 0 ? NULL : km_mop_strdup(op, f[1]);
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

/* In time: 0 caught up, else since the newest record mirrored was stamped; -1 unknown (the pipeline runs elsewhere). */
static int64_t lag_time_of(const km_state_partition_info *p, int64_t lag, int64_t now_ms)
{
	if (lag == 0)
		return 0;
	if (lag < 0 || p->newest_mirrored_ts <= 0)
		return -1;
	return now_ms > p->newest_mirrored_ts ? now_ms - p->newest_mirrored_ts : 0;
}

/* The kmirrords as each last reported itself in the state (docs/state.md, "Instances"). */
static void list_instances(km_mop *op, km_list_mirrors_response *r)
{
	size_t n;
	const km_state_instance *in = km_state_instances(op->st, &n);
	const char *self = op->mi ? km_mirror_self(op->mi) : NULL;
	int64_t now_ms = km_wall_ms();

	if (!n || !(r->instances.items = km_arena_calloc(&op->a, sizeof(*r->instances.items) * n)))
		return;
	for (size_t i = 0; i < n; i++) {
		km_list_mirrors_response_listed_instance *x = &r->instances.items[r->instances.count];
		km_str *owned = in[i].nowned ? km_arena_calloc(&op->a, sizeof(*owned) * in[i].nowned) : NULL;
		if (in[i].nowned && !owned)
			break;
		km_list_mirrors_response_listed_instance_init(x);
		x->instance_id = km_str_c(in[i].id);
		x->report_age_ms = now_ms - in[i].report_ms;
		x->start_time_ms = in[i].start_ms;
		x->state_delay_ms = in[i].state_delay_ms;
		x->pipelines = km_str_c(in[i].pipelines);
		x->software_version = km_str_c(in[i].version);
		/* A mirror deleted since the instance's last report is not shown as run. */
		for (size_t k = 0; k < in[i].nowned; k++)
			if (km_state_mirror_find(op->st, in[i].owned[k]))
				owned[x->owned_mirrors.count++] = km_str_c(in[i].owned[k]);
		x->owned_mirrors.items = owned;
		x->is_self = self && !strcmp(self, in[i].id);
		r->instances.count++;
	}
}

static void answer_list(km_mop *op)
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
	list_instances(op, &r);
	km_mop_answer(op, &r);
}

static bool named(km_str name, const km_str *names, int32_t n)
{
	for (int32_t i = 0; i < n; i++)
		if (km_str_eq(name, names[i]))
			return true;
	return false;
}

/* What a step syncs, from the mirror's options. */
static km_str sync_scope(km_mop *op, const km_mirror_options *o, km_sync_kind kind)
{
	char text[2048];
	if (kind == KM_SYNC_CONFIGS || kind == KM_SYNC_PARTITIONS)
		return km_str_c("the mirror's topics");
	if (kind == KM_SYNC_ACLS)
		snprintf(text, sizeof(text), "%s", o->acl_include && *o->acl_include ? o->acl_include : "off");
	else if (kind == KM_SYNC_GROUPS && o->groups_include && *o->groups_include)
		snprintf(text, sizeof(text), "include %s%s%s", o->groups_include,
			 o->groups_exclude && *o->groups_exclude ? "; exclude " : "",
			 o->groups_exclude && *o->groups_exclude ? o->groups_exclude : "");
	else if (kind == KM_SYNC_TOPICS && o->topics_include && *o->topics_include)
		snprintf(text, sizeof(text), "include %s%s%s", o->topics_include,
			 o->topics_exclude && *o->topics_exclude ? "; exclude " : "",
			 o->topics_exclude && *o->topics_exclude ? o->topics_exclude : "");
	else
		snprintf(text, sizeof(text), "off");
	return km_str_c(km_mop_strdup(op, km_str_c(text)));
}

/* The metadata sync's status of mirror m, one entry per step (docs/mirror.md, "Metadata sync"). */
static void describe_sync(km_mop *op, const km_state_mirror *m, km_describe_mirrors_response_described_mirror *d)
{
	const char *mirror = km_state_mirror_name(m);
	km_mirror_options o;
	bool have = km_state_mirror_options(m, &o) == KM_OK;

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
		ds->last_error = st.last_error ? km_str_c(km_mop_strdup(op, km_str_c(st.last_error))) : KM_STR_NULL;
		ds->last_error_time_ms = st.last_error ? st.last_error_ms : -1;
		if (have)
			ds->scope = sync_scope(op, &o, (km_sync_kind)k);
	}
	if (have)
		km_opt_free(km_state_mirror_option_table(), &o);
}

static void describe_one(km_mop *op, const km_state_mirror *m, km_describe_mirrors_response_described_mirror *d)
{
	const km_describe_mirrors_request *q = &op->m.describe;
	size_t nc = km_state_mirror_config_count(m), nt = km_state_mirror_topic_count(m);
	int64_t now_ms = km_wall_ms(); /* one clock for every partition's lag time */

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
		dt->source_topic_id = km_state_topic_source_id(t);
		dt->started_by_pattern = km_state_topic_by_pattern(t);
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
			dp->lag_time_ms = lag_time_of(&p, dp->lag, now_ms);
			dp->skipped_records = p.skipped_records;
			dp->open_transaction_offset = p.open_txn_offset;
			dp->records_hidden = p.records_hidden;
			dp->source_log_end_time_ms = p.source_log_end_ms;
			dp->last_error = cstr(p.last_error);
			dp->last_error_time_ms = p.last_error ? p.last_error_ms : -1;
		}
	}
	if (op->mi) {
		const char *owner = km_mirror_owner(op->mi, km_state_mirror_name(m));
		d->owner = owner ? km_str_c(km_mop_strdup(op, km_str_c(owner))) : KM_STR_NULL;
		describe_sync(op, m, d);
	}
}

static void answer_describe(km_mop *op)
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
			const char *name = km_mop_strdup(op, q->mirror_names.items[i]);
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
	km_mop_answer(op, &r);
}

static void answer_lmo(km_mop *op)
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
		tr->source_topic_id = km_state_topic_source_id(t);
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
	km_mop_answer(op, &r);
}

/* ---- the RPCs' apply ---- */

typedef void (*mirror_config_fn)(km_state *st, const char *name, const km_state_kv *kv, size_t n, bool validate_only,
				 km_state_done_cb done, void *arg);

/* CreateMirror and AlterMirror (one layout: name, configs, validate_only): the store takes its own copy. */
static void apply_configs(km_mop *op, mirror_config_fn fn)
{
	const km_create_mirror_request *q = &op->m.create;
	km_state_kv *kv = config_kv(op, q->configs.items, q->configs.count, sizeof(*q->configs.items));
	fn(op->st, op->mirror, kv, (size_t)(q->configs.count > 0 ? q->configs.count : 0), q->validate_only, simple_done,
	   op);
	wipe_kv(kv, q->configs.count);
}

static void apply_create(km_mop *op)
{
	apply_configs(op, km_state_create_mirror);
}

static void apply_alter(km_mop *op)
{
	apply_configs(op, km_state_alter_mirror);
}

static void apply_delete(km_mop *op)
{
	km_state_delete_mirror(op->st, op->mirror, simple_done, op);
}

/* Start, stop, pause, resume: only the topics the authorizer allowed go on. */
static void apply_topics(km_mop *op)
{
	size_t n;
	const char **allowed = pending_topics(op, &n);
	if (!allowed || !n) {
		answer_topics(op, 0, NULL, op->tcode, op->tmsg);
		return;
	}
	/* A start first has the destination topics there (created from the source when missing). */
	if (op->op == KM_TOPIC_START && op->mi) {
		km_mirror_prepare_start(op->mi, op->mirror, allowed, n, op->m.start.adopt_existing, prepare_done, op);
		return;
	}
	km_state_topics(op->st, op->op, op->mirror, allowed, n, topics_done, op);
}

static void fresh_poll(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	proceed(arg);
}

/*
 * Authorized: carry the operation out once the store has been read back. An operation on a mirror
 * this kmirrord does not know waits first for a view that holds every change acknowledged before
 * the request came, through whichever kmirrord: a mirror created through one and started through
 * another a moment later is found (docs/state.md, "Following"). A view that cannot be had within
 * KM_MOP_FRESH_WAIT_MS (the state topic unreachable) does, as it is.
 */
static void proceed(km_mop *op)
{
	if (!km_state_ready(op->st)) {
		answer_error(op, KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS, km_mop_loading_msg);
		return;
	}
	if (op->key != KM_API_CREATE_MIRROR && op->mirror && op->mirror[0] && !km_state_mirror_find(op->st, op->mirror) &&
	    !km_state_follow_reached(op->st, op->fresh_ticket) && km_mono_ms() < op->fresh_until && op->base) {
		struct timeval tv = {0, KM_MOP_FRESH_POLL_MS * 1000};
		if (!op->fresh_ev)
			op->fresh_ev = evtimer_new(op->base, fresh_poll, op);
		if (op->fresh_ev && evtimer_add(op->fresh_ev, &tv) == 0)
			return;
	}
	op->rpc->apply(op);
}

/* ---- the RPCs' checks: KM_OK, or the code with err ---- */

/* CreateMirror and AlterMirror: a valid name, configs named once each; create needs every value. */
static km_err check_configs(km_mop *op, bool values, char *err, size_t errlen)
{
	const km_create_mirror_request *q = &op->m.create;
	km_err rc;

	op->mirror = km_mop_strdup(op, q->mirror_name);
	if ((rc = km_mirror_check_name(q->mirror_name, "mirror", err, errlen)) != KM_OK)
		return rc;
	for (int32_t i = 0; i < q->configs.count; i++) {
		if (q->configs.items[i].name.len <= 0) {
			snprintf(err, errlen, "config %d has an empty name", (int)i);
			return KM_KAFKA_INVALID_REQUEST;
		}
		if (values && q->configs.items[i].value.len < 0) {
			snprintf(err, errlen, "config %.*s has no value", (int)q->configs.items[i].name.len,
				 q->configs.items[i].name.p);
			return KM_KAFKA_INVALID_REQUEST;
		}
	}
	if (q->configs.count > 0) {
		size_t n = (size_t)q->configs.count, dup;
		if (km_str_first_dup(q->configs.items, n, sizeof(*q->configs.items),
				     offsetof(km_create_mirror_request_mirror_config, name), &dup) != KM_OK)
			return KM_ERR_NOMEM;
		if (dup < n) {
			snprintf(err, errlen, "config %.*s is given more than once", (int)q->configs.items[dup].name.len,
				 q->configs.items[dup].name.p);
			return KM_KAFKA_INVALID_REQUEST;
		}
	}
	return KM_OK;
}

static km_err check_create(km_mop *op, char *err, size_t errlen)
{
	return check_configs(op, true, err, errlen);
}

static km_err check_alter(km_mop *op, char *err, size_t errlen)
{
	return check_configs(op, false, err, errlen);
}

static km_err check_delete(km_mop *op, char *err, size_t errlen)
{
	op->mirror = km_mop_strdup(op, op->m.del.mirror_name);
	return km_mirror_check_name(op->m.del.mirror_name, "mirror", err, errlen);
}

static km_err check_list(km_mop *op, char *err, size_t errlen)
{
	(void)op;
	(void)err;
	(void)errlen;
	return KM_OK;
}

static km_err check_describe(km_mop *op, char *err, size_t errlen)
{
	const km_describe_mirrors_request *q = &op->m.describe;
	km_err rc;
	if (q->mirror_names.count > 0 &&
	    (rc = km_mirror_check_names(q->mirror_names.items, (size_t)q->mirror_names.count, "mirror", err, errlen)) !=
		    KM_OK)
		return rc;
	if (q->topics.count > 0)
		return km_mirror_check_names(q->topics.items, (size_t)q->topics.count, "topic", err, errlen);
	return KM_OK;
}

static km_err check_lmo(km_mop *op, char *err, size_t errlen)
{
	const km_last_mirrored_offsets_request *q = &op->m.lmo;
	km_str *names;
	km_err rc;

	op->mirror = km_mop_strdup(op, q->mirror_name);
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

/* A topic operation's mirror and topics (names as decoded, copied into op): valid, at least one, none twice. */
static km_err check_topics(km_mop *op, const km_str *names, char *err, size_t errlen)
{
	km_err rc;

	op->topics = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
	op->tcode = km_arena_calloc(&op->a, sizeof(int16_t) * (op->ntopics + 1));
	op->tmsg = km_arena_calloc(&op->a, sizeof(char *) * (op->ntopics + 1));
	if (!names || !op->topics || !op->tcode || !op->tmsg)
		return KM_ERR_NOMEM;
	for (size_t i = 0; i < op->ntopics; i++)
		op->topics[i] = km_mop_strdup(op, names[i]);
	if ((rc = km_mirror_check_name(km_str_c(op->mirror), "mirror", err, errlen)) != KM_OK)
		return rc;
	if (!op->ntopics) {
		snprintf(err, errlen, "no topics given");
		return KM_KAFKA_INVALID_REQUEST;
	}
	return km_mirror_check_names(names, op->ntopics, "topic", err, errlen);
}

/* The four topic operations' requests have one layout: one check per RPC, from one macro. */
#define CHECK_TOPICS(fn, OP, field)                                                                        \
	static km_err fn(km_mop *op, char *err, size_t errlen)                                                \
	{                                                                                                  \
		km_str *names;                                                                             \
		op->op = (OP);                                                                             \
		op->mirror = km_mop_strdup(op, op->m.field.mirror_name);                                       \
		op->ntopics = op->m.field.topics.count > 0 ? (size_t)op->m.field.topics.count : 0;         \
		names = km_arena_calloc(&op->a, sizeof(km_str) * (op->ntopics + 1));                       \
		for (size_t i_ = 0; names && i_ < op->ntopics; i_++)                                       \
			names[i_] = op->m.field.topics.items[i_].name;                                     \
		return check_topics(op, names, err, errlen);                                               \
	}

CHECK_TOPICS(check_start, KM_TOPIC_START, start)
CHECK_TOPICS(check_stop, KM_TOPIC_STOP, stop)
CHECK_TOPICS(check_pause, KM_TOPIC_PAUSE, pause)
CHECK_TOPICS(check_resume, KM_TOPIC_RESUME, resume)

/* A mirror RPC's request: decoded, checked, then authorized by a probe; answered once the store is done. */
static km_err mirror_request(km_req *rq, const km_mop_rpc *rpc)
{
	char err[400];
	km_err rc;
	km_mop *op = km_mop_new(rq, &rc);

	if (!op) {
		/* A header the session's fixed-part check let through (a v1 header where v2 is due, say). */
		if (rc == KM_ERR_DECODE) {
			rq->close_reason = "malformed mirror request header";
			km_metrics_mirror_rpc_error(km_session_host_of(rq->s)->metrics, rq->h->api_key, KM_ERR_DECODE);
		}
		return rc;
	}
	op->rpc = rpc;
	op->now = rq;
	if (km_mop_decode(op) != KM_OK) {
		/* What a broker does with a request it cannot parse. */
		count_error(op, KM_ERR_DECODE);
		km_mop_free(op);
		rq->close_reason = "malformed mirror request";
		return KM_ERR_DECODE;
	}
	rc = rpc->check(op, err, sizeof(err));
	if (rc == KM_ERR_NOMEM) {
		km_mop_free(op);
		return rc;
	}
	if (rc != KM_OK) {
		answer_error(op, rc, err);
		return KM_OK;
	}
	if (!op->st) {
		answer_error(op, KM_MIRROR_STATE_UNAVAILABLE, km_mop_no_store_msg);
		return KM_OK;
	}
	if ((rc = authorize(rq, op)) != KM_OK) {
		/* A probe already sent reports the close (the session closes on this error) and frees op. */
		if (!op->probes)
			km_mop_free(op);
		else
			op->now = NULL;
		return rc;
	}
	op->now = NULL;
	rq->pending = true;
	return KM_OK;
}

/* ---- the RPCs: one row each ---- */

/* Each RPC: key, name, check, authorize, apply, error answer, topics answer, and the note of its row. */
#define MIRROR_RPCS(X)                                                                                             \
	X(KM_API_CREATE_MIRROR, create, check_create, KM_MOP_AUTH_CLUSTER_ALTER, apply_create, create_error, NULL,     \
	  "authorized as ALTER_CONFIGS on CLUSTER (and ALTER on CLUSTER with mirror.acl.include set), then the store creates the mirror")                                  \
	X(KM_API_DELETE_MIRROR, delete, check_delete, KM_MOP_AUTH_CLUSTER_ALTER, apply_delete, delete_error, NULL,     \
	  "authorized as ALTER_CONFIGS on CLUSTER, then the store deletes the mirror")                                  \
	X(KM_API_LIST_MIRRORS, list, check_list, KM_MOP_AUTH_CLUSTER_DESCRIBE, answer_list, list_error, NULL,          \
	  "authorized as DESCRIBE_CONFIGS on CLUSTER; answered from the store")                                         \
	X(KM_API_DESCRIBE_MIRRORS, describe, check_describe, KM_MOP_AUTH_CLUSTER_DESCRIBE, answer_describe,            \
	  describe_error, NULL, "authorized as DESCRIBE_CONFIGS on CLUSTER; answered from the store (secrets masked)")  \
	X(KM_API_ALTER_MIRROR, alter, check_alter, KM_MOP_AUTH_CLUSTER_ALTER, apply_alter, alter_error, NULL,          \
	  "authorized as ALTER_CONFIGS on CLUSTER (and ALTER on CLUSTER with mirror.acl.include set), then the store changes the options")                                 \
	X(KM_API_START_MIRROR_TOPICS, start, check_start, KM_MOP_AUTH_TOPICS, apply_topics, topics_error, start_answer, \
	  "authorized as ALTER_CONFIGS on each topic (and CREATE on those the destination lacks), then the store starts them")                                      \
	X(KM_API_STOP_MIRROR_TOPICS, stop, check_stop, KM_MOP_AUTH_TOPICS, apply_topics, topics_error, stop_answer,    \
	  "authorized as ALTER_CONFIGS on each topic, then the store stops them")                                       \
	X(KM_API_PAUSE_MIRROR_TOPICS, pause, check_pause, KM_MOP_AUTH_TOPICS, apply_topics, topics_error, pause_answer, \
	  "authorized as ALTER_CONFIGS on each topic, then the store pauses them")                                      \
	X(KM_API_RESUME_MIRROR_TOPICS, resume, check_resume, KM_MOP_AUTH_TOPICS, apply_topics, topics_error,           \
	  resume_answer, "authorized as ALTER_CONFIGS on each topic, then the store resumes them")                      \
	X(KM_API_LAST_MIRRORED_OFFSETS, lmo, check_lmo, KM_MOP_AUTH_CLUSTER_DESCRIBE, answer_lmo, lmo_error, NULL,     \
	  "authorized as DESCRIBE_CONFIGS on CLUSTER; answered from the store")

/* Each RPC's parts, and its row's own hook: the request with those parts. */
#define RPC_PARTS(key_, name_, check_, auth_, apply_, error_, topics_, note_)                                      \
	static const km_mop_rpc name_##_rpc = {check_, auth_, apply_, error_, topics_};                                \
	static km_err name_##_request(km_req *rq)                                                                  \
	{                                                                                                          \
		return mirror_request(rq, &name_##_rpc);                                                           \
	}
MIRROR_RPCS(RPC_PARTS)

/* ---- the stages ---- */

/* A mirror RPC: answered here (later, once the store has done its work), never forwarded. */
#define RPC_STAGE(key_, name_, check_, auth_, apply_, error_, topics_, note_)                                      \
	{.key = (key_), .req = KM_REQ_LOCAL, .frame_cap = KM_FRAME_CAP_LOCAL, .on_request = name_##_request,        \
	 .resp = KM_RESP_LOCAL, .note = (note_)},

static const km_proxy_stage stages[] = {MIRROR_RPCS(RPC_STAGE)};

const km_proxy_feature km_mirror_rpc_feature = {"mirror-rpc", stages, sizeof(stages) / sizeof(stages[0])};
