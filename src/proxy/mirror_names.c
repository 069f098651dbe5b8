/* mirror.name, the topic config that names a topic's mirror: set, paused or removed through the config APIs, shown by DescribeConfigs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "proxy/features.h"
#include "proxy/mirror_rpc_int.h"
#include "proxy/rewrite.h"

/* ---- mirror.name through IncrementalAlterConfigs and AlterConfigs ---- */

static const char *state_topic_of(const km_state *st)
{
	return st ? km_state_topic_name_of_store(st) : KM_MIRROR_STATE_TOPIC_DEFAULT;
}

/* A mirror topic that is not STOPPED: its configs are the metadata sync's. */
static bool synced(void *arg, km_str name, char *msg, size_t len)
{
	const km_state_topic *t = km_state_topic_find(arg, name.p, (size_t)(name.len > 0 ? name.len : 0));
	const km_state_mirror *m;
	if (!t || km_state_topic_state(t) == KM_MP_STOPPED)
		return false;
	m = km_state_topic_mirror(t);
	snprintf(msg, len,
		 "topic %s is mirrored by mirror %s from %s: its configs follow its source topic's; change them on "
		 "the source cluster, or stop its mirroring (kmirror stop --mirror %s --topics %s) to change them here",
		 km_state_topic_name(t), km_state_mirror_name(m), km_state_mirror_source(m), km_state_mirror_name(m),
		 km_state_topic_name(t));
	return true;
}

static void cfg_answer(km_mop *op)
{
	if (op->key == KM_API_INCREMENTAL_ALTER_CONFIGS) {
		km_incremental_alter_configs_response r;
		if (km_mcfg_merge_iac(&op->m.iac, &op->sp, &op->a, &r) == KM_OK) {
			km_mop_answer(op, &r);
			return;
		}
	} else {
		km_alter_configs_response r;
		if (km_mcfg_merge_ac(&op->m.ac, &op->sp, &op->a, &r) == KM_OK) {
			km_mop_answer(op, &r);
			return;
		}
	}
	KM_WARN("proxy", op->sid, "out of memory answering a mirror.name change");
	km_mop_free(op);
}

static km_str res_name(const km_mop *op, int32_t i)
{
	return op->key == KM_API_INCREMENTAL_ALTER_CONFIGS ? op->m.iac.resources.items[i].resource_name :
							     op->m.ac.resources.items[i].resource_name;
}

static void cfg_next(km_mop *op);

static void cfg_done(void *arg, const km_state_result *res)
{
	km_mop *op = arg;
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
static bool cfg_plan(km_mop *op, int32_t i, km_topic_op *top, const char **mirror, const km_state_topic **tp,
		     km_mp_state *state)
{
	const km_mcfg_res *r = &op->sp.res[i];
	km_str topic = res_name(op, i);
	const km_state_topic *t = km_state_topic_find(op->st, topic.p, (size_t)(topic.len > 0 ? topic.len : 0));
	const char *cur = t ? km_state_mirror_name(km_state_topic_mirror(t)) : NULL;
	km_mp_state s = t ? km_state_topic_state(t) : KM_MP_UNKNOWN;
	bool same;

	*mirror = r->mirror.len > 0 ? km_mop_strdup(op, r->mirror) : cur;
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
static void cfg_validate(km_mop *op, int32_t i, km_topic_op top, const char *mirror, const km_state_topic *t,
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
static void cfg_next(km_mop *op)
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
			km_mcfg_set(&op->sp, i, KM_MIRROR_STATE_UNAVAILABLE, km_mop_no_store_msg, &op->a);
			continue;
		}
		if (!km_state_ready(op->st)) {
			km_mcfg_set(&op->sp, i, KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS, km_mop_loading_msg, &op->a);
			continue;
		}
		if (!cfg_plan(op, i, &top, &mirror, &t, &state))
			continue;
		if (op->validate_only) {
			cfg_validate(op, i, top, mirror, t, state);
			continue;
		}
		topic = km_mop_strdup(op, res_name(op, i));
		if (KM_LOG_INFO <= km_log_current) {
			/* The value and the topic's name are the client's bytes (escaped). */
			char vtxt[KM_LOG_ESCAPED_SIZE(256)], ttxt[KM_LOG_ESCAPED_SIZE(256)];
			km_str tn = res_name(op, i);
			km_log_escape(vtxt, sizeof(vtxt), r->mirror.p, r->mirror.len > 256 ? 256 : r->mirror.len);
			km_log_escape(ttxt, sizeof(ttxt), tn.p, tn.len > 256 ? 256 : tn.len);
			KM_INFO("proxy", op->sid, "%s=%s on topic %s: %s mirroring from %s", KM_MIRROR_NAME_CONFIG, vtxt, ttxt,
				km_topic_op_name(top), mirror);
		}
		km_state_topics(op->st, top, mirror, &topic, 1, cfg_done, op);
		return; /* cfg_done goes on (op may be gone already) */
	}
	cfg_answer(op);
}

/* A probe of a config request answered: the broker's results become the resources' outcomes. */
static void cfg_probe_done(km_mop *op, km_err err, const uint8_t *body, size_t len, bool iac, bool auth)
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
		km_mop_free(op);
		return;
	}
	cfg_next(op);
}

static void iac_fwd_done(void *arg, km_err err, const uint8_t *body, size_t len)
{
	km_mop *op = arg;
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
	km_mcfg_guard guard;
	km_mop *op;
	km_err rc;

	/*
	 * What does not decode is not forwarded either: a broker ignores bytes after a request, so a
	 * request this check cannot read could still change mirror.name or the state topic's configs.
	 * Closed, as the read-only admin path closes on a request it cannot read.
	 */
	op = km_mop_new(rq, &rc);
	if (!op) {
		if (rc == KM_ERR_DECODE)
			rq->close_reason = "malformed config request header";
		return rc;
	}
	if (km_mop_decode(op) != KM_OK) {
		km_mop_free(op);
		rq->close_reason = "malformed config request";
		return KM_ERR_DECODE;
	}
	guard.state_topic = state_topic_of(host->state);
	guard.synced = host->state ? synced : NULL;
	guard.arg = host->state;
	guard.code = (int16_t)km_proxy_features_of(rq->s)->read_only.read_only_code;
	rc = iac ? km_mcfg_split_iac(&op->m.iac, &guard, &op->a, &op->sp) :
		   km_mcfg_split_ac(&op->m.ac, &guard, &op->a, &op->sp);
	if (rc != KM_OK || !op->sp.mine) {
		km_mop_free(op);
		return rc;
	}
	op->validate_only = iac ? op->m.iac.validate_only : op->m.ac.validate_only;
	op->now = rq;
	if (iac && op->sp.fwd.resources.count > 0)
		rc = km_mop_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, op->version, &op->sp.fwd, iac_fwd_done);
	if (rc == KM_OK && !iac && op->sp.fwd_legacy.resources.count > 0)
		rc = km_mop_probe(rq, op, KM_API_ALTER_CONFIGS, op->version, &op->sp.fwd_legacy, iac_fwd_done);
	if (rc == KM_OK && !iac && op->sp.auth.resources.count > 0)
		rc = km_mop_probe(rq, op, KM_API_INCREMENTAL_ALTER_CONFIGS, KM_PROBE_IAC_VERSION, &op->sp.auth,
				ac_auth_done);
	if (rc != KM_OK) {
		/* A probe already sent reports the close (the session closes on this error) and frees op. */
		if (!op->probes)
			km_mop_free(op);
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

	if (!st || !km_state_ready(st) || !km_state_mirror_count(st) || !km_mop_body_offset(rq, &off))
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

static const km_proxy_stage stages[] = {
	{.key = KM_API_DESCRIBE_CONFIGS, .req = KM_REQ_HOLD, .on_request = describe_request,
	 .note = "mirror topics show mirror.name"},
	{.key = KM_API_ALTER_CONFIGS, .req = KM_REQ_HOLD, .on_request = config_request,
	 .note = "mirror.name on a topic is a mirror operation (the rest forwarded without it); __mirror_state refused; undecodable: closed"},
	{.key = KM_API_INCREMENTAL_ALTER_CONFIGS, .req = KM_REQ_HOLD, .on_request = config_request,
	 .note = "mirror.name on a topic is a mirror operation (the rest forwarded without it); __mirror_state refused; undecodable: closed"},
};

const km_proxy_feature km_mirror_name_feature = {"mirror-name", stages, sizeof(stages) / sizeof(stages[0]), .needs_state = true};
