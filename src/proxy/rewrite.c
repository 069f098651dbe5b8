/* Response rewriting: broker endpoints become the proxy's, ApiVersions is narrowed; everything else is copied verbatim. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "kmirror/log.h"
#include "kmirror/msg/api_versions_response.h"
#include "kmirror/msg/describe_configs_response.h"
#include "kmirror/msg/describe_quorum_response.h"
#include "kmirror/msg/share_acknowledge_response.h"
#include "kmirror/msg/share_fetch_response.h"
#include "kmirror/net.h"
#include "proxy/apis.h"
#include "proxy/rewrite.h"

int32_t km_rewrite_port(const km_rewrite_ctx *ctx, int32_t node_id)
{
	if (node_id < 0 || node_id >= ctx->port_count)
		return -1;
	return ctx->port_base + node_id;
}

/* ---- copy helpers: read a field from r and write it unchanged to w ---- */

static void cp_raw(km_rd *r, km_wr *w, size_t n, const char *field)
{
	const uint8_t *p;
	if (km_rd_raw(r, field, n, &p))
		km_wr_raw(w, p, n);
}

static void cp_str(km_rd *r, km_wr *w, bool compact, bool nullable, const char *field)
{
	km_str s;
	if (km_rd_string(r, field, compact, nullable, &s))
		km_wr_string(w, compact, s);
}

/* A tagged-field section, skipped. */
static bool skip_tags(km_rd *r)
{
	uint32_t n, tag, sz;
	if (!km_rd_uvarint(r, "tags", &n))
		return false;
	for (uint32_t i = 0; i < n && km_rd_ok(r); i++) {
		km_rd_uvarint(r, "tag", &tag);
		km_rd_uvarint(r, "tag_size", &sz);
		km_rd_skip(r, "tag_data", sz);
	}
	return km_rd_ok(r);
}

static void cp_tags(km_rd *r, km_wr *w)
{
	size_t start = r->pos;
	if (skip_tags(r))
		km_wr_raw(w, r->buf + start, r->pos - start);
}

static void cp_rest(km_rd *r, km_wr *w)
{
	if (km_rd_ok(r))
		km_wr_raw(w, r->buf + r->pos, r->len - r->pos);
}

/* One broker endpoint: node id already read; host and port read from r, replaced in w. */
static void endpoint(km_rd *r, km_wr *w, bool compact, int32_t node, km_rewrite_ctx *ctx, km_str *host_out,
		     int32_t *port_out)
{
	km_str host;
	int32_t port = 0, mapped;
	km_rd_string(r, "host", compact, false, &host);
	km_rd_i32(r, "port", &port);
	*host_out = host;
	*port_out = port;
	mapped = km_rewrite_port(ctx, node);
	if (node >= 0 && mapped < 0)
		KM_WARN("proxy", 0, "broker node %d has no proxy port (broker_port_count %d)", node, ctx->port_count);
	if (node < 0) {
		/* An error answer (node -1, empty host): nothing real to hide, keep it as the broker sent it. */
		km_wr_string(w, compact, host);
		km_wr_i32(w, port);
		return;
	}
	km_wr_string(w, compact, km_str_c(ctx->host));
	km_wr_i32(w, mapped);
	ctx->rewritten++;
}

static km_err finish(km_rd *r, km_wr *w, const char *what, int16_t version)
{
	if (!km_rd_ok(r)) {
		KM_WARN("proxy", 0, "cannot rewrite %s v%d: %s at byte %zu (%s)", what, version,
			r->err_field ? r->err_field : "?", r->err_pos, r->err_what ? r->err_what : "");
		return KM_ERR_DECODE;
	}
	return km_wr_ok(w) ? KM_OK : KM_ERR_NOMEM;
}

km_err km_rewrite_metadata(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	bool flex = version >= 9;
	km_rd r;
	int32_t n;

	if (version < 0 || version > KM_REWRITE_METADATA_MAX_VERSION)
		return KM_ERR_UNSUPPORTED;
	km_rd_init(&r, body, len);
	if (version >= 3)
		cp_raw(&r, out, 4, "throttle_time_ms");
	if (km_rd_array_len(&r, "brokers", flex, false, 10, &n))
		km_wr_array_len(out, flex, n);
	for (int32_t i = 0; i < n && km_rd_ok(&r); i++) {
		int32_t node = 0, port;
		km_str host, rack = KM_STR_NULL;
		km_rd_i32(&r, "node_id", &node);
		km_wr_i32(out, node);
		endpoint(&r, out, flex, node, ctx, &host, &port);
		if (version >= 1) {
			km_rd_string(&r, "rack", flex, true, &rack);
			km_wr_string(out, flex, rack);
		}
		if (flex)
			cp_tags(&r, out);
		if (km_rd_ok(&r) && ctx->learn)
			ctx->learn(ctx->arg, node, host, port, rack);
	}
	cp_rest(&r, out);
	return finish(&r, out, "Metadata", version);
}

km_err km_rewrite_find_coordinator(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	bool flex = version >= 3;
	km_rd r;

	if (version < 0 || version > KM_REWRITE_FIND_COORDINATOR_MAX_VERSION)
		return KM_ERR_UNSUPPORTED;
	km_rd_init(&r, body, len);
	if (version >= 1)
		cp_raw(&r, out, 4, "throttle_time_ms");
	if (version <= 3) {
		int32_t node = 0, port;
		km_str host;
		cp_raw(&r, out, 2, "error_code");
		if (version >= 1)
			cp_str(&r, out, flex, true, "error_message");
		km_rd_i32(&r, "node_id", &node);
		km_wr_i32(out, node);
		endpoint(&r, out, flex, node, ctx, &host, &port);
	} else {
		int32_t n = 0;
		if (km_rd_array_len(&r, "coordinators", true, false, 14, &n))
			km_wr_array_len(out, true, n);
		for (int32_t i = 0; i < n && km_rd_ok(&r); i++) {
			int32_t node = 0, port;
			km_str host;
			cp_str(&r, out, true, false, "key");
			km_rd_i32(&r, "node_id", &node);
			km_wr_i32(out, node);
			endpoint(&r, out, true, node, ctx, &host, &port);
			cp_raw(&r, out, 2, "error_code");
			cp_str(&r, out, true, true, "error_message");
			cp_tags(&r, out);
		}
	}
	cp_rest(&r, out);
	return finish(&r, out, "FindCoordinator", version);
}

km_err km_rewrite_describe_cluster(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	km_rd r;
	int32_t n = 0;

	if (version < 0 || version > KM_REWRITE_DESCRIBE_CLUSTER_MAX_VERSION)
		return KM_ERR_UNSUPPORTED;
	km_rd_init(&r, body, len);
	cp_raw(&r, out, 4, "throttle_time_ms");
	cp_raw(&r, out, 2, "error_code");
	cp_str(&r, out, true, true, "error_message");
	if (version >= 1)
		cp_raw(&r, out, 1, "endpoint_type");
	cp_str(&r, out, true, false, "cluster_id");
	cp_raw(&r, out, 4, "controller_id");
	if (km_rd_array_len(&r, "brokers", true, false, 12, &n))
		km_wr_array_len(out, true, n);
	for (int32_t i = 0; i < n && km_rd_ok(&r); i++) {
		int32_t node = 0, port;
		km_str host;
		km_rd_i32(&r, "broker_id", &node);
		km_wr_i32(out, node);
		endpoint(&r, out, true, node, ctx, &host, &port);
		{
			km_str rack = KM_STR_NULL;
			km_rd_string(&r, "rack", true, true, &rack);
			km_wr_string(out, true, rack);
			if (version >= 2)
				cp_raw(&r, out, 1, "is_fenced");
			cp_tags(&r, out);
			if (km_rd_ok(&r) && ctx->learn)
				ctx->learn(ctx->arg, node, host, port, rack);
		}
	}
	cp_rest(&r, out);
	return finish(&r, out, "DescribeCluster", version);
}

const km_feature_need km_feature_needs[] = {
	/* KIP-890 part 2: the producer adds partitions implicitly and bumps its epoch per transaction. */
	{"transaction.version", 2, KM_API_PRODUCE, 12},
	{"transaction.version", 2, KM_API_END_TXN, 5},
	{"transaction.version", 2, KM_API_TXN_OFFSET_COMMIT, 5},
	/* KIP-848 consumer groups, KIP-932 share groups, KIP-1071 streams groups. */
	{"group.version", 1, KM_API_CONSUMER_GROUP_HEARTBEAT, 0},
	{"share.version", 1, KM_API_SHARE_GROUP_HEARTBEAT, 1},
	{"share.version", 1, KM_API_SHARE_FETCH, 1},
	{"share.version", 1, KM_API_SHARE_ACKNOWLEDGE, 1},
	{"streams.version", 1, KM_API_STREAMS_GROUP_HEARTBEAT, 0},
};
const size_t km_feature_needs_count = sizeof(km_feature_needs) / sizeof(km_feature_needs[0]);

/* The highest level <= max of feature whose needs the offered keys meet. */
static int16_t feature_level(km_str name, int16_t max, const km_api_versions_response *m)
{
	for (int16_t level = max; level > 0; level--) {
		bool ok = true;
		for (size_t i = 0; ok && i < km_feature_needs_count; i++) {
			const km_feature_need *n = &km_feature_needs[i];
			bool offered = false;
			if (!km_str_eq_c(name, n->feature) || n->level > level)
				continue;
			for (int32_t k = 0; k < m->api_keys.count; k++)
				if (m->api_keys.items[k].api_key == n->api_key && m->api_keys.items[k].max_version >= n->min_version)
					offered = true;
			ok = offered;
		}
		if (ok)
			return level;
	}
	return 0;
}

km_err km_rewrite_api_versions(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	const km_api_info *info = km_api_lookup(KM_API_API_VERSIONS);
	km_api_versions_response m;
	km_api_versions_response_api_version *keys;
	int32_t kept = 0, nkeys;
	size_t nrows = km_proxy_apis_count(ctx->apis);
	km_arena a;
	km_rd r;
	km_err rc;

	if (version < info->min_version || version > info->max_version)
		return KM_ERR_UNSUPPORTED;
	/* A broker that does not know the requested version answers UNSUPPORTED_VERSION in the v0 layout. */
	if (len >= 2 && km_be16(body) == KM_KAFKA_UNSUPPORTED_VERSION)
		version = 0;
	km_arena_init(&a, 0);
	km_api_versions_response_init(&m);
	km_rd_init(&r, body, len);
	rc = km_api_versions_response_decode(&r, version, &m, &a);
	if (rc == KM_OK && (!km_rd_ok(&r) || km_rd_left(&r) != 0))
		rc = KM_ERR_DECODE;
	if (rc != KM_OK) {
		KM_WARN("proxy", 0, "cannot rewrite ApiVersions v%d: %s at byte %zu (%s)", version,
			r.err_field ? r.err_field : "?", r.err_pos, r.err_what ? r.err_what : "trailing bytes");
		km_arena_free(&a);
		return KM_ERR_DECODE;
	}
	nkeys = m.api_keys.count > 0 ? m.api_keys.count : 0;
	keys = km_arena_alloc(&a, ((size_t)nkeys + nrows + 1) * sizeof(*keys));
	if (!keys) {
		km_arena_free(&a);
		return KM_ERR_NOMEM;
	}
	/* The broker's keys that the proxy forwards, each narrowed to what both sides serve. */
	for (int32_t i = 0; i < nkeys; i++) {
		km_api_versions_response_api_version k = m.api_keys.items[i];
		const km_proxy_api *row = km_proxy_apis_find(ctx->apis, k.api_key);
		if (!row || row->req == KM_REQ_LOCAL)
			continue; /* a key the proxy cannot parse is never advertised; a local one is the proxy's */
		if (km_proxy_api_min(row) > k.min_version && !row->shows_lower)
			k.min_version = km_proxy_api_min(row);
		if (km_proxy_api_max(row) < k.max_version)
			k.max_version = km_proxy_api_max(row);
		if (k.min_version > k.max_version)
			continue;
		keys[kept++] = k;
	}
	/* The APIs the proxy answers itself (the mirror RPCs): its own versions. */
	for (size_t i = 0; i < nrows && m.error_code == 0; i++) {
		const km_proxy_api *row = km_proxy_apis_at(ctx->apis, i);
		if (row->req != KM_REQ_LOCAL)
			continue;
		km_api_versions_response_api_version_init(&keys[kept]);
		keys[kept].api_key = row->key;
		keys[kept].min_version = km_proxy_api_min(row);
		keys[kept].max_version = km_proxy_api_max(row);
		kept++;
	}
	m.api_keys.items = keys;
	m.api_keys.count = kept;
	/* Features: a client that sees a level uses the versions it needs, so the level follows what is offered. */
	{
		int32_t f = 0;
		for (int32_t i = 0; i < m.finalized_features.count; i++) {
			km_api_versions_response_finalized_feature_key k = m.finalized_features.items[i];
			int16_t level = feature_level(k.name, k.max_version_level, &m);
			if (level != k.max_version_level)
				KM_DEBUG("proxy", 0, "finalized feature %.*s: level %d lowered to %d (versions not offered)",
					 (int)k.name.len, k.name.p, k.max_version_level, level);
			if (level < k.min_version_level || (level == 0 && k.max_version_level > 0))
				continue; /* dropped: no level the client could use */
			k.max_version_level = level;
			m.finalized_features.items[f++] = k;
		}
		if (m.finalized_features.count > 0)
			m.finalized_features.count = f;
		f = 0;
		for (int32_t i = 0; i < m.supported_features.count; i++) {
			km_api_versions_response_supported_feature_key k = m.supported_features.items[i];
			int16_t level = feature_level(k.name, k.max_version, &m);
			if (level < k.min_version || (level == 0 && k.max_version > 0))
				continue;
			k.max_version = level;
			m.supported_features.items[f++] = k;
		}
		if (m.supported_features.count > 0)
			m.supported_features.count = f;
	}
	km_api_versions_response_encode(out, version, &m);
	km_arena_free(&a);
	return km_wr_ok(out) ? KM_OK : KM_ERR_ENCODE;
}

void km_api_versions_unsupported_body(km_wr *out)
{
	const km_api_info *a = km_api_lookup(KM_API_API_VERSIONS);
	km_wr_i16(out, KM_KAFKA_UNSUPPORTED_VERSION);
	km_wr_array_len(out, false, 1);
	km_wr_i16(out, KM_API_API_VERSIONS);
	km_wr_i16(out, a->min_version);
	km_wr_i16(out, a->max_version);
}

/* ---- responses decoded and re-encoded whole with the generated codec ---- */

/* Decode body as a whole message: every byte must belong to it. */
static km_err decode_whole(const km_api_codec *c, const uint8_t *body, size_t len, int16_t version, void *m,
			   km_arena *a, const char *what)
{
	km_rd r;
	km_err rc;
	km_rd_init(&r, body, len);
	c->init(m);
	rc = c->decode(&r, version, m, a);
	if (rc == KM_OK && km_rd_ok(&r) && km_rd_left(&r) == 0)
		return KM_OK;
	KM_WARN("proxy", 0, "cannot rewrite %s v%d: %s at byte %zu (%s)", what, version,
		r.err_field ? r.err_field : "?", r.err_pos, r.err_what ? r.err_what : "trailing bytes");
	return KM_ERR_DECODE;
}

static km_err encode_whole(const km_api_codec *c, km_wr *out, int16_t version, const void *m)
{
	c->encode(out, version, m);
	return km_wr_ok(out) ? KM_OK : KM_ERR_ENCODE;
}

static const km_api_codec *response_codec(int16_t key, int16_t version)
{
	const km_api_info *a = km_api_lookup(key);
	if (!a || version < a->min_version || version > a->max_version)
		return NULL;
	return &a->response;
}

/* DescribeConfigs resource types whose values may name this cluster's endpoints. */
enum { KM_CONFIG_RESOURCE_BROKER = 4, KM_CONFIG_RESOURCE_BROKER_LOGGER = 8 };

static bool host_char(char c)
{
	return isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_';
}

bool km_rewrite_value_has_endpoint(km_str v)
{
	/* host:port where host is a name, a dotted address or a bracketed IPv6 address; "0:1"-style pairs are not. */
	for (int32_t i = 0; i < v.len; i++) {
		int32_t h, d = i + 1;
		bool named = false;
		if (v.p[i] != ':')
			continue;
		while (d < v.len && d - i <= 6 && isdigit((unsigned char)v.p[d]))
			d++;
		if (d == i + 1 || d - i > 6 || (d < v.len && (isalnum((unsigned char)v.p[d]) || v.p[d] == '.')))
			continue;
		if (i > 0 && v.p[i - 1] == ']')
			return true;
		for (h = i - 1; h >= 0 && host_char(v.p[h]); h--)
			if (!isdigit((unsigned char)v.p[h]))
				named = true;
		if (h < i - 1 && named)
			return true;
	}
	return false;
}

/* Whether a broker config key always names endpoints, whatever its value looks like. */
static bool endpoint_key(km_str name)
{
	static const char sfx[] = "listeners";
	size_t n = sizeof(sfx) - 1;
	if (km_str_eq_c(name, "controller.quorum.bootstrap.servers") || km_str_eq_c(name, "controller.quorum.voters"))
		return true;
	return name.len >= (int32_t)n && memcmp(name.p + name.len - n, sfx, n) == 0 &&
	       (name.len == (int32_t)n || name.p[name.len - n - 1] == '.');
}

/*
 * advertised.listeners of a node becomes the proxy's one endpoint for it, under the listener name
 * of the first upstream entry. KM_STR_NULL when the node has no proxy port (the caller hides it).
 */
static km_str advertised_value(km_str upstream, int32_t node, km_rewrite_ctx *ctx, km_arena *a)
{
	int32_t port = km_rewrite_port(ctx, node), nl = 0;
	bool v6 = strchr(ctx->host, ':') != NULL;
	size_t cap;
	char *buf;
	int n;

	if (port < 0)
		return KM_STR_NULL;
	while (nl + 2 < upstream.len && upstream.p[nl] != ',' && memcmp(upstream.p + nl, "://", 3) != 0)
		nl++;
	if (nl + 2 >= upstream.len || upstream.p[nl] == ',')
		nl = 0; /* no NAME:// prefix: the proxy's endpoint alone */
	cap = (size_t)nl + strlen(ctx->host) + 32;
	buf = km_arena_alloc(a, cap);
	if (!buf)
		return KM_STR_NULL;
	n = snprintf(buf, cap, "%.*s%s%s%s%s:%d", (int)nl, upstream.p, nl ? "://" : "", v6 ? "[" : "", ctx->host,
		     v6 ? "]" : "", (int)port);
	if (n < 0 || (size_t)n >= cap)
		return KM_STR_NULL;
	return (km_str){buf, n};
}

/* What becomes of one config (or synonym) value: kept, replaced (advertised.listeners) or hidden (null). */
static bool config_value(km_str name, km_str *value, int32_t node, km_rewrite_ctx *ctx, km_arena *a)
{
	if (value->len <= 0)
		return false; /* null or empty: nothing to hide */
	if (km_str_eq_c(name, "advertised.listeners")) {
		*value = advertised_value(*value, node, ctx, a);
		ctx->rewritten++;
		return value->len < 0;
	}
	if (endpoint_key(name) || km_rewrite_value_has_endpoint(*value)) {
		*value = KM_STR_NULL;
		ctx->rewritten++;
		return true;
	}
	return false;
}

/* The node id a BROKER resource names ("" is the cluster-wide default: -1). */
static int32_t resource_node(km_str name)
{
	int32_t node = 0;
	if (name.len <= 0 || name.len > 9)
		return -1;
	for (int32_t i = 0; i < name.len; i++) {
		if (!isdigit((unsigned char)name.p[i]))
			return -1;
		node = node * 10 + (name.p[i] - '0');
	}
	return node;
}

km_err km_rewrite_describe_configs(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	const km_api_codec *c = response_codec(KM_API_DESCRIBE_CONFIGS, version);
	km_describe_configs_response m;
	km_arena a;
	km_err rc;

	if (!c)
		return KM_ERR_UNSUPPORTED;
	km_arena_init(&a, 0);
	rc = decode_whole(c, body, len, version, &m, &a, "DescribeConfigs");
	for (int32_t i = 0; rc == KM_OK && i < m.results.count; i++) {
		km_describe_configs_response_describe_configs_result *res = &m.results.items[i];
		int32_t node = resource_node(res->resource_name);
		if (res->resource_type != KM_CONFIG_RESOURCE_BROKER && res->resource_type != KM_CONFIG_RESOURCE_BROKER_LOGGER)
			continue;
		for (int32_t j = 0; j < res->configs.count; j++) {
			km_describe_configs_response_describe_configs_resource_result *cf = &res->configs.items[j];
			/* Hidden the way a broker hides a password: null value, marked sensitive. */
			if (config_value(cf->name, &cf->value, node, ctx, &a))
				cf->is_sensitive = true;
			for (int32_t k = 0; k < cf->synonyms.count; k++)
				config_value(cf->synonyms.items[k].name, &cf->synonyms.items[k].value, node, ctx, &a);
		}
	}
	if (rc == KM_OK)
		rc = km_arena_err(&a) != KM_OK ? km_arena_err(&a) : encode_whole(c, out, version, &m);
	km_arena_free(&a);
	return rc;
}

km_err km_rewrite_describe_quorum(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	const km_api_codec *c = response_codec(KM_API_DESCRIBE_QUORUM, version);
	km_describe_quorum_response m;
	km_arena a;
	km_err rc;

	if (!c)
		return KM_ERR_UNSUPPORTED;
	km_arena_init(&a, 0);
	rc = decode_whole(c, body, len, version, &m, &a, "DescribeQuorum");
	/* Controllers have no proxy port: their endpoints go, the node ids (and the quorum state) stay. */
	for (int32_t i = 0; rc == KM_OK && i < m.nodes.count; i++) {
		if (m.nodes.items[i].listeners.count > 0)
			ctx->rewritten += m.nodes.items[i].listeners.count;
		m.nodes.items[i].listeners.count = 0;
	}
	if (rc == KM_OK)
		rc = encode_whole(c, out, version, &m);
	km_arena_free(&a);
	return rc;
}

/* NodeEndpoints of a share response: the same fields in both types, so one macro body serves both. */
#define KM_REWRITE_NODE_ENDPOINTS(arr, ctx)                                                                 \
	for (int32_t i_ = 0; i_ < (arr).count; i_++) {                                                      \
		int32_t node_ = (arr).items[i_].node_id;                                                   \
		if (node_ < 0)                                                                             \
			continue;                                                                          \
		if ((ctx)->learn)                                                                          \
			(ctx)->learn((ctx)->arg, node_, (arr).items[i_].host, (arr).items[i_].port,        \
				     (arr).items[i_].rack);                                                \
		(arr).items[i_].host = km_str_c((ctx)->host);                                              \
		(arr).items[i_].port = km_rewrite_port((ctx), node_);                                      \
		(ctx)->rewritten++;                                                                        \
	}

/* ShareFetch and ShareAcknowledge: the same NodeEndpoints array, each response decoded by its own codec. */
static km_err rewrite_share(int16_t key, const char *what, const uint8_t *body, size_t len, int16_t version,
			    km_rewrite_ctx *ctx, km_wr *out)
{
	const km_api_codec *c = response_codec(key, version);
	union {
		km_share_fetch_response fetch;
		km_share_acknowledge_response ack;
	} m;
	km_arena a;
	km_err rc;

	if (!c)
		return KM_ERR_UNSUPPORTED;
	km_arena_init(&a, 0);
	rc = decode_whole(c, body, len, version, &m, &a, what);
	if (rc == KM_OK) {
		if (key == KM_API_SHARE_FETCH) {
			KM_REWRITE_NODE_ENDPOINTS(m.fetch.node_endpoints, ctx);
		} else {
			KM_REWRITE_NODE_ENDPOINTS(m.ack.node_endpoints, ctx);
		}
		rc = encode_whole(c, out, version, &m);
	}
	km_arena_free(&a);
	return rc;
}

km_err km_rewrite_share_fetch(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	return rewrite_share(KM_API_SHARE_FETCH, "ShareFetch", body, len, version, ctx, out);
}

km_err km_rewrite_share_acknowledge(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out)
{
	return rewrite_share(KM_API_SHARE_ACKNOWLEDGE, "ShareAcknowledge", body, len, version, ctx, out);
}

/* ---- Produce / Fetch: find the top-level tagged fields without touching record data ---- */

/*
 * A Produce answer is walked where it lies, pulled up into one piece, with the codec's reader:
 * answers are small, and both callers pull the frame up next anyway. Walking it through km_evrd
 * cost a few thousand instructions an answer, a tenth of the produce path's own work.
 */

/* A compact (nullable) string, skipped. */
static bool skip_compact(km_rd *r, const char *field)
{
	km_str s;
	return km_rd_string(r, field, true, true, &s);
}

/* A compact array's length: null counts as empty; a count beyond the bytes left is corrupt (each element takes one at least). */
static bool array_len(km_rd *r, const char *field, uint32_t *n)
{
	int32_t v;
	if (!km_rd_array_len(r, field, true, true, 1, &v))
		return false;
	*n = v > 0 ? (uint32_t)v : 0;
	return true;
}

static bool walk_produce(km_rd *r, int16_t version)
{
	uint32_t topics, parts, errs;
	if (!array_len(r, "topics", &topics))
		return false;
	for (uint32_t t = 0; t < topics; t++) {
		/* v13+: topic id instead of the name */
		if (!(version >= 13 ? km_rd_skip(r, "topic_id", 16) : skip_compact(r, "name")) ||
		    !array_len(r, "partitions", &parts))
			return false;
		for (uint32_t p = 0; p < parts; p++) {
			/* index, error, base offset, log append time, log start offset */
			if (!km_rd_skip(r, "partition", 4 + 2 + 8 + 8 + 8) || !array_len(r, "record_errors", &errs))
				return false;
			for (uint32_t e = 0; e < errs; e++)
				if (!km_rd_skip(r, "batch_index", 4) || !skip_compact(r, "batch_index_error_message") ||
				    !skip_tags(r))
					return false;
			if (!skip_compact(r, "error_message") || !skip_tags(r))
				return false;
		}
		if (!skip_tags(r))
			return false;
	}
	return km_rd_skip(r, "throttle_time_ms", 4);
}

km_err km_rewrite_produce_top_tags(struct evbuffer *buf, size_t frame_start, size_t frame_end, int16_t version,
				   size_t *tags_off)
{
	const uint8_t *p;
	km_rd r;

	if (frame_end > evbuffer_get_length(buf) || frame_start + 8 > frame_end)
		return KM_ERR_DECODE;
	if (!(p = evbuffer_pullup(buf, (ev_ssize_t)frame_end)))
		return KM_ERR_NOMEM;
	km_rd_init(&r, p, frame_end);
	r.pos = frame_start + 4 + 4; /* past size and correlation id */
	if (!skip_tags(&r)) /* response header v1 */
		return KM_ERR_DECODE;
	if (version < 9)
		return KM_ERR_UNSUPPORTED; /* no tagged fields before v9 */
	if (!walk_produce(&r, version))
		return KM_ERR_DECODE;
	*tags_off = r.pos;
	/* The tagged fields must end exactly at the frame end, or the walk went wrong somewhere. */
	if (!skip_tags(&r) || r.pos != frame_end)
		return KM_ERR_DECODE;
	return KM_OK;
}

km_err km_rewrite_node_endpoint_tags(const uint8_t *tags, size_t len, km_rewrite_ctx *ctx, km_wr *out)
{
	km_rd r;
	uint32_t n = 0;

	km_rd_init(&r, tags, len);
	km_rd_uvarint(&r, "tags", &n);
	km_wr_uvarint(out, n);
	for (uint32_t i = 0; i < n && km_rd_ok(&r); i++) {
		uint32_t tag = 0, sz = 0;
		km_rd sub;
		km_rd_uvarint(&r, "tag", &tag);
		km_rd_uvarint(&r, "tag_size", &sz);
		if (!km_rd_sub(&r, "tag_data", sz, &sub))
			break;
		km_wr_uvarint(out, tag);
		if (tag != 0) {
			km_wr_uvarint(out, sz);
			km_wr_raw(out, sub.buf + sub.pos, sz);
			continue;
		}
		/* NodeEndpoints: re-encode into a scratch writer, then size-prefix it. */
		{
			km_wr ne;
			int32_t cnt = 0;
			km_wr_init(&ne);
			if (km_rd_array_len(&sub, "node_endpoints", true, false, 8, &cnt))
				km_wr_array_len(&ne, true, cnt);
			for (int32_t j = 0; j < cnt && km_rd_ok(&sub); j++) {
				int32_t node = 0, port;
				km_str host, rack = KM_STR_NULL;
				km_rd_i32(&sub, "node_id", &node);
				km_wr_i32(&ne, node);
				endpoint(&sub, &ne, true, node, ctx, &host, &port);
				km_rd_string(&sub, "rack", true, true, &rack);
				km_wr_string(&ne, true, rack);
				cp_tags(&sub, &ne);
				if (km_rd_ok(&sub) && ctx->learn)
					ctx->learn(ctx->arg, node, host, port, rack);
			}
			if (!km_rd_ok(&sub) || km_rd_left(&sub) != 0) {
				km_wr_free(&ne);
				r.err = KM_ERR_DECODE;
				break;
			}
			km_wr_uvarint(out, (uint32_t)ne.len);
			km_wr_raw(out, ne.buf, ne.len);
			if (!km_wr_ok(&ne))
				out->err = ne.err;
			km_wr_free(&ne);
		}
	}
	if (km_rd_ok(&r) && km_rd_left(&r) != 0)
		return KM_ERR_DECODE;
	return finish(&r, out, "NodeEndpoints", 0);
}

/* ---- size-preserving tail rewrite ---- */

#define KM_FILLER_TAG 127 /* an unknown top-level tag: one uvarint byte, after every known one */

/* Append a filler tagged field of exactly n bytes (n >= 2) to w. */
static bool filler(km_wr *w, size_t n)
{
	for (size_t vl = 1; vl <= 3; vl++) {
		size_t m;
		if (n < 1 + vl)
			return false;
		m = n - 1 - vl;
		if (km_sz_uvarint((uint32_t)m) == vl) {
			km_wr_uvarint(w, KM_FILLER_TAG);
			km_wr_uvarint(w, (uint32_t)m);
			for (size_t i = 0; i < m; i++)
				km_wr_i8(w, 0);
			return true;
		}
	}
	return false;
}

/* tags (with count n, fields from body) plus one filler, padded to exactly len bytes. */
static km_err pad_to(const uint8_t *body, size_t body_len, uint32_t n, size_t len, uint8_t *out)
{
	km_wr w;
	km_err rc = KM_ERR_ENCODE;
	km_wr_init(&w);
	km_wr_uvarint(&w, n + 1);
	km_wr_raw(&w, body, body_len);
	if (w.len + 2 <= len && filler(&w, len - w.len) && km_wr_ok(&w) && w.len == len) {
		memcpy(out, w.buf, len);
		rc = KM_OK;
	}
	km_wr_free(&w);
	return rc;
}

km_err km_rewrite_node_endpoint_tags_same_size(const uint8_t *tags, size_t len, km_rewrite_ctx *ctx, uint8_t *out)
{
	km_wr w;
	km_rd r;
	uint32_t n = 0, kept = 0;
	km_err rc;

	km_wr_init(&w);
	rc = km_rewrite_node_endpoint_tags(tags, len, ctx, &w);
	if (rc != KM_OK) {
		km_wr_free(&w);
		return rc;
	}
	if (w.len == len) {
		memcpy(out, w.buf, len);
		km_wr_free(&w);
		return KM_OK;
	}
	/* Shorter: the same tags plus a filler. */
	km_rd_init(&r, w.buf, w.len);
	km_rd_uvarint(&r, "tags", &n);
	if (w.len < len && km_rd_ok(&r) && pad_to(w.buf + r.pos, w.len - r.pos, n, len, out) == KM_OK) {
		km_wr_free(&w);
		return KM_OK;
	}
	km_wr_free(&w);
	/* Longer (or no room for a filler): keep every tag but NodeEndpoints, then pad. */
	km_wr_init(&w);
	km_rd_init(&r, tags, len);
	km_rd_uvarint(&r, "tags", &n);
	for (uint32_t i = 0; i < n && km_rd_ok(&r); i++) {
		uint32_t tag = 0, sz = 0;
		const uint8_t *p;
		km_rd_uvarint(&r, "tag", &tag);
		km_rd_uvarint(&r, "tag_size", &sz);
		if (!km_rd_raw(&r, "tag_data", sz, &p) || tag == 0)
			continue;
		km_wr_uvarint(&w, tag);
		km_wr_uvarint(&w, sz);
		km_wr_raw(&w, p, sz);
		kept++;
	}
	rc = km_rd_ok(&r) && km_wr_ok(&w) ? pad_to(w.buf, w.len, kept, len, out) : KM_ERR_DECODE;
	km_wr_free(&w);
	return rc;
}
