/* The proxy's API table: the rows that differ from a plain forward, their hooks, and the lookup over every served key. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/log.h"
#include "proxy/apis.h"
#include "proxy/readonly.h"
#include "proxy/mirror_rpc.h"
#include "proxy/offsets.h"
#include "proxy/rewrite.h"

const char *const km_req_action_names[] = {"forward", "hold", "local"};
const char *const km_resp_action_names[] = {"forward", "stream", "whole", "local"};

/* ---- hooks ---- */

km_err km_proxy_produce_acks(const uint8_t *p, size_t len, int16_t version, int16_t *acks)
{
	km_req_header h;
	km_rd r;
	km_str txn;
	bool flexible = version >= 9;
	km_err rc = km_net_parse_request_header(p, len, km_net_produce_header_version(version), &h);

	if (rc != KM_OK)
		return rc;
	km_rd_init(&r, p + h.body_offset, len - h.body_offset);
	if (version >= 3)
		km_rd_string(&r, "transactional_id", flexible, true, &txn);
	km_rd_i16(&r, "acks", acks);
	return km_rd_ok(&r) ? KM_OK : r.err;
}

/*
 * Produce: acks=0 has no response, so it takes no FIFO slot. Acks come after the transactional id,
 * which can be long: ask for more of the frame (bounded by it) when the first bytes do not reach.
 */
km_err km_proxy_produce_classify(km_req *rq)
{
	int16_t acks = -1;
	km_err rc = km_proxy_produce_acks(rq->body, rq->body_len, rq->h->api_version, &acks);

	if (rc != KM_OK) {
		if (rq->body_len < rq->frame_len && rq->body_len < 70000) {
			rq->need = rq->frame_len < 70000 ? rq->frame_len : 70000;
			return KM_OK;
		}
		rq->close_reason = "malformed Produce request";
		return KM_ERR_DECODE;
	}
	rq->expect_response = acks != 0;
	return KM_OK;
}

/* Produce v10+: the body moves untouched; only a non-empty top-level tag section (NodeEndpoints) is re-encoded. */
km_err km_proxy_produce_response(km_resp *rs)
{
	size_t end = rs->frame_len + 4, tags_off, tlen;
	uint8_t *tags, pre[4];
	km_wr w;
	km_err rc;

	rc = km_rewrite_produce_top_tags(rs->in, 0, end, rs->version, &tags_off);
	if (rc != KM_OK)
		return rc;
	tlen = end - tags_off;
	tags = evbuffer_pullup(rs->in, (ev_ssize_t)end);
	if (!tags)
		return KM_ERR_NOMEM;
	tags += tags_off;
	if (tlen == 1 && tags[0] == 0) {
		evbuffer_remove_buffer(rs->in, rs->out, end);
		return KM_OK;
	}
	km_wr_init(&w);
	rc = km_rewrite_node_endpoint_tags(tags, tlen, rs->rw, &w);
	if (rc == KM_OK && !km_wr_ok(&w))
		rc = KM_ERR_NOMEM;
	if (rc == KM_OK) {
		km_put_be32(pre, (uint32_t)(tags_off - 4 + w.len));
		evbuffer_add(rs->out, pre, 4);
		evbuffer_drain(rs->in, 4);
		evbuffer_remove_buffer(rs->in, rs->out, tags_off - 4);
		evbuffer_drain(rs->in, tlen);
		evbuffer_add(rs->out, w.buf, w.len);
	}
	km_wr_free(&w);
	return rc;
}

/* Fetch v16+: NodeEndpoints in the tail, rewritten to the same length (the size prefix is gone already). */
km_err km_proxy_fetch_tail(const uint8_t *tail, size_t len, uint8_t *out, km_rewrite_ctx *rw, void *ctx)
{
	(void)ctx;
	if (len == 1 && tail[0] == 0) {
		out[0] = 0;
		return KM_OK;
	}
	return km_rewrite_node_endpoint_tags_same_size(tail, len, rw, out);
}

static const km_stream_hooks fetch_hooks = {.on_tail = km_proxy_fetch_tail};

/* ApiVersions newer than the proxy knows: answered here as a broker does (v0 body, UNSUPPORTED_VERSION). */
static km_err api_versions_classify(km_req *rq)
{
	const km_api_info *a = km_api_lookup(KM_API_API_VERSIONS);
	if (rq->h->api_version > a->max_version) {
		rq->action = KM_REQ_LOCAL;
		rq->resp = KM_RESP_LOCAL;
	}
	return KM_OK;
}

static km_err api_versions_too_new(km_req *rq)
{
	km_wr w;
	km_wr_init(&w);
	km_api_versions_unsupported_body(&w);
	rq->answer = evbuffer_new();
	if (!km_wr_ok(&w) || !rq->answer || evbuffer_add(rq->answer, w.buf, w.len) != 0) {
		km_wr_free(&w);
		return KM_ERR_NOMEM;
	}
	km_wr_free(&w);
	KM_DEBUG("proxy", 0, "ApiVersions v%d is newer than the proxy knows: answering UNSUPPORTED_VERSION",
		 rq->h->api_version);
	return KM_OK;
}

/* ---- the rows: everything not listed is a plain forward of the codec's versions ---- */

static const km_proxy_api rows[] = {
	{.key = KM_API_PRODUCE, .min_version = -1, .max_version = -1, .classify = km_proxy_produce_classify,
	 .resp = KM_RESP_WHOLE, .resp_from = 10, .on_response = km_proxy_produce_response,
	 .note = "acks=0 takes no FIFO slot; v10+ responses: NodeEndpoints rewritten in the tail"},
	{.key = KM_API_FETCH, .min_version = -1, .max_version = -1, .resp = KM_RESP_STREAM, .resp_from = 16,
	 .stream = &fetch_hooks, .note = "v16+ responses streamed through the walker; NodeEndpoints rewritten in place"},
	{.key = KM_API_METADATA, .min_version = -1, .max_version = KM_REWRITE_METADATA_MAX_VERSION, .resp = KM_RESP_WHOLE,
	 .rewrite = km_rewrite_metadata, .note = "broker endpoints become the proxy's; the brokers are learned"},
	{.key = KM_API_FIND_COORDINATOR, .min_version = -1, .max_version = KM_REWRITE_FIND_COORDINATOR_MAX_VERSION,
	 .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_find_coordinator, .note = "coordinator endpoints become the proxy's"},
	{.key = KM_API_DESCRIBE_CLUSTER, .min_version = -1, .max_version = KM_REWRITE_DESCRIBE_CLUSTER_MAX_VERSION,
	 .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_describe_cluster, .note = "broker endpoints become the proxy's"},
	{.key = KM_API_API_VERSIONS, .min_version = -1, .max_version = -1, .classify = api_versions_classify,
	 .on_request = api_versions_too_new, .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_api_versions,
	 .note = "too new: answered here; versions narrowed to this table, features to what they need"},
	{.key = KM_API_SASL_HANDSHAKE, .min_version = 1, .max_version = -1,
	 .note = "v0 is refused: its tokens travel outside Kafka framing"},
	/* v10 only swaps topic names for ids: a group's offsets asked by a previous upstream's id after
	 * an upstream swap would read as none, and the consumer would reset. By name they carry over. */
	{.key = KM_API_OFFSET_COMMIT, .min_version = -1, .max_version = 9,
	 .note = "up to v9 (by topic name, not id): offsets outlive an upstream swap"},
	{.key = KM_API_OFFSET_FETCH, .min_version = -1, .max_version = 9,
	 .note = "up to v9 (by topic name, not id): offsets outlive an upstream swap"},
	/* DescribeConfigs, IncrementalAlterConfigs, AlterConfigs and the mirror RPCs: mirror_rpc.c. */
	{.key = KM_API_DESCRIBE_QUORUM, .min_version = -1, .max_version = -1, .resp = KM_RESP_WHOLE,
	 .rewrite = km_rewrite_describe_quorum, .note = "controller listeners emptied"},
	{.key = KM_API_SHARE_FETCH, .min_version = -1, .max_version = -1, .resp = KM_RESP_WHOLE,
	 .rewrite = km_rewrite_share_fetch, .note = "NodeEndpoints become the proxy's"},
	{.key = KM_API_SHARE_ACKNOWLEDGE, .min_version = -1, .max_version = -1, .resp = KM_RESP_WHOLE,
	 .rewrite = km_rewrite_share_acknowledge, .note = "NodeEndpoints become the proxy's"},
};

/* ---- the table ---- */

#define KM_APIS_INDEX 256 /* keys below this are found by index; the rest by a scan */

struct km_proxy_apis {
	km_proxy_api *rows; /* sorted by key */
	size_t count, cap;
	int16_t index[KM_APIS_INDEX]; /* key -> row + 1, 0: none */
};

static void reindex(km_proxy_apis *t)
{
	memset(t->index, 0, sizeof(t->index));
	for (size_t i = 0; i < t->count; i++)
		if (t->rows[i].key >= 0 && t->rows[i].key < KM_APIS_INDEX)
			t->index[t->rows[i].key] = (int16_t)(i + 1);
}

km_err km_proxy_apis_set(km_proxy_apis *t, const km_proxy_api *row)
{
	size_t i = 0;
	if (row->key < 0)
		return KM_ERR_INVAL;
	while (i < t->count && t->rows[i].key < row->key)
		i++;
	if (i < t->count && t->rows[i].key == row->key) {
		t->rows[i] = *row;
		return KM_OK;
	}
	if (t->count == t->cap) {
		size_t ncap = t->cap ? t->cap * 2 : 64;
		km_proxy_api *n = realloc(t->rows, ncap * sizeof(*n));
		if (!n)
			return KM_ERR_NOMEM;
		t->rows = n;
		t->cap = ncap;
	}
	memmove(t->rows + i + 1, t->rows + i, (t->count - i) * sizeof(*t->rows));
	t->rows[i] = *row;
	t->count++;
	reindex(t);
	return KM_OK;
}

km_proxy_apis *km_proxy_apis_new(void)
{
	km_proxy_apis *t = calloc(1, sizeof(*t));
	size_t n;
	const km_api_info *codec = km_api_table(&n);

	if (!t)
		return NULL;
	/* Broker-listener APIs only: controller-only APIs are never advertised to clients. */
	for (size_t i = 0; i < n; i++) {
		km_proxy_api plain = {.key = codec[i].api_key, .min_version = -1, .max_version = -1};
		if ((codec[i].listeners & KM_API_LISTENER_BROKER) && km_proxy_apis_set(t, &plain) != KM_OK)
			goto fail;
	}
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (km_proxy_apis_set(t, &rows[i]) != KM_OK)
			goto fail;
	/* Read-only mirror topics: Produce wrapped, DeleteRecords, DeleteTopics and CreatePartitions checked. */
	if (km_ro_register(t) != KM_OK)
		goto fail;
	/* Mirror topics' offsets: Fetch, ListOffsets, OffsetForLeaderEpoch, DescribeProducers; Produce and DeleteRecords wrapped again. */
	if (km_off_register(t) != KM_OK)
		goto fail;
	if (km_mirror_rpc_register(t) != KM_OK)
		goto fail;
	return t;
fail:
	km_proxy_apis_free(t);
	return NULL;
}

void km_proxy_apis_free(km_proxy_apis *t)
{
	if (!t)
		return;
	free(t->rows);
	free(t);
}

const km_proxy_api *km_proxy_apis_find(const km_proxy_apis *t, int16_t key)
{
	if (key >= 0 && key < KM_APIS_INDEX)
		return t->index[key] ? &t->rows[t->index[key] - 1] : NULL;
	for (size_t i = 0; i < t->count; i++)
		if (t->rows[i].key == key)
			return &t->rows[i];
	return NULL;
}

size_t km_proxy_apis_count(const km_proxy_apis *t)
{
	return t->count;
}

const km_proxy_api *km_proxy_apis_at(const km_proxy_apis *t, size_t i)
{
	return &t->rows[i];
}

int16_t km_proxy_api_min(const km_proxy_api *a)
{
	const km_api_info *c = km_api_lookup(a->key);
	if (a->min_version >= 0)
		return a->min_version;
	return c ? c->min_version : 0;
}

int16_t km_proxy_api_max(const km_proxy_api *a)
{
	const km_api_info *c = km_api_lookup(a->key);
	int16_t v = c ? c->max_version : -1;
	/* A row may serve less than the codec knows (its hooks were written for older versions), never more. */
	if (a->max_version >= 0 && (!c || a->max_version < v))
		v = a->max_version;
	return v;
}

km_resp_action km_proxy_api_resp(const km_proxy_api *a, int16_t version)
{
	return version >= a->resp_from ? a->resp : KM_RESP_FORWARD;
}

const char *km_proxy_api_name(const km_proxy_api *a)
{
	const km_api_info *c = km_api_lookup(a->key);
	return a->name ? a->name : c ? c->name : "?";
}

int km_proxy_request_header_version(int16_t key, int16_t version)
{
	int v = km_api_request_header_version(key, version);
	return v < 0 ? 1 : v;
}

int km_proxy_response_header_version(int16_t key, int16_t version)
{
	/* ApiVersions answers with header v0 always, so a client can parse it before it knows versions. */
	int v = km_api_response_header_version(key, version);
	return v < 0 ? 0 : v;
}

void km_proxy_apis_write_doc(const km_proxy_apis *t, struct evbuffer *out)
{
	evbuffer_add_printf(out, "| key | API | versions | request | response | what and why |\n");
	evbuffer_add_printf(out, "| --- | --- | --- | --- | --- | --- |\n");
	for (size_t i = 0; i < t->count; i++) {
		const km_proxy_api *a = &t->rows[i];
		char resp[32];
		if (!a->note)
			continue; /* plain forwards: one line below the table */
		if (a->resp != KM_RESP_FORWARD && a->resp_from > km_proxy_api_min(a))
			snprintf(resp, sizeof(resp), "%s (v%d+)", km_resp_action_names[a->resp], a->resp_from);
		else
			snprintf(resp, sizeof(resp), "%s", km_resp_action_names[a->resp]);
		evbuffer_add_printf(out, "| %d | %s | %d-%d | %s%s | %s | %s |\n", a->key, km_proxy_api_name(a),
				    km_proxy_api_min(a), km_proxy_api_max(a), km_req_action_names[a->req],
				    a->classify ? " + classify" : "", resp, a->note);
	}
}
