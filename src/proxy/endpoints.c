/* The proxy's own feature: versions served, Produce acks, and broker endpoints made the proxy's in every response that names one. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/log.h"
#include "proxy/apis.h"
#include "proxy/rewrite.h"

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

/* ---- the stages: every API not listed is a plain forward of the codec's versions ---- */

static const km_proxy_stage stages[] = {
	{.key = KM_API_PRODUCE, .classify = km_proxy_produce_classify, .resp = KM_RESP_WHOLE, .resp_from = 10,
	 .on_response = km_proxy_produce_response,
	 .note = "acks=0 takes no FIFO slot; v10+ responses: NodeEndpoints rewritten in the tail"},
	{.key = KM_API_FETCH, .resp = KM_RESP_STREAM, .resp_from = 16, .stream = &fetch_hooks,
	 .note = "v16+ responses streamed through the walker; NodeEndpoints rewritten in place"},
	{.key = KM_API_METADATA, .versions = true, .min_version = -1, .max_version = KM_REWRITE_METADATA_MAX_VERSION,
	 .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_metadata,
	 .note = "broker endpoints become the proxy's; the brokers are learned"},
	{.key = KM_API_FIND_COORDINATOR, .versions = true, .min_version = -1,
	 .max_version = KM_REWRITE_FIND_COORDINATOR_MAX_VERSION, .resp = KM_RESP_WHOLE,
	 .rewrite = km_rewrite_find_coordinator, .note = "coordinator endpoints become the proxy's"},
	{.key = KM_API_DESCRIBE_CLUSTER, .versions = true, .min_version = -1,
	 .max_version = KM_REWRITE_DESCRIBE_CLUSTER_MAX_VERSION, .resp = KM_RESP_WHOLE,
	 .rewrite = km_rewrite_describe_cluster, .note = "broker endpoints become the proxy's"},
	{.key = KM_API_API_VERSIONS, .classify = api_versions_classify, .on_request = api_versions_too_new,
	 .frame_cap = KM_FRAME_CAP_AUTH, .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_api_versions,
	 .note = "too new: answered here; versions narrowed to this table, features to what they need"},
	/* Shown from v0 all the same: librdkafka 2.0 (Debian 12's, kcat's) finds SaslHandshake v1 only in
	 * a range that starts at v0, and without it sends SaslAuthenticate unannounced (the broker closes). */
	{.key = KM_API_SASL_HANDSHAKE, .versions = true, .min_version = 1, .max_version = -1, .shows_lower = true,
	 .frame_cap = KM_FRAME_CAP_AUTH,
	 .note = "v0 is refused: its tokens travel outside Kafka framing (ApiVersions shows it: older librdkafka looks for it)"},
	{.key = KM_API_SASL_AUTHENTICATE, .frame_cap = KM_FRAME_CAP_AUTH,
	 .note = "frames over max_auth_frame_bytes closed, as before authentication on a broker"},
	/* v10 only swaps topic names for ids: a group's offsets asked by a previous upstream's id after
	 * an upstream swap would read as none, and the consumer would reset. By name they carry over. */
	{.key = KM_API_OFFSET_COMMIT, .versions = true, .min_version = -1, .max_version = 9,
	 .note = "up to v9 (by topic name, not id): offsets outlive an upstream swap"},
	{.key = KM_API_OFFSET_FETCH, .versions = true, .min_version = -1, .max_version = 9,
	 .note = "up to v9 (by topic name, not id): offsets outlive an upstream swap"},
	{.key = KM_API_DESCRIBE_CONFIGS, .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_describe_configs,
	 .note = "broker listener configs hidden or made the proxy's"},
	{.key = KM_API_DESCRIBE_QUORUM, .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_describe_quorum,
	 .note = "controller listeners emptied"},
	{.key = KM_API_SHARE_FETCH, .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_share_fetch,
	 .note = "NodeEndpoints become the proxy's"},
	{.key = KM_API_SHARE_ACKNOWLEDGE, .resp = KM_RESP_WHOLE, .rewrite = km_rewrite_share_acknowledge,
	 .note = "NodeEndpoints become the proxy's"},
};

const km_proxy_feature km_endpoints_feature = {"endpoints", stages, sizeof(stages) / sizeof(stages[0])};
