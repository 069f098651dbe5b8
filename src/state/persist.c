/* __mirror_state's persistence: the destination (one km_cluster) as the persister uses it, its requests, metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/rpc.h"
#include "state/persist_int.h"

/*
 * The versions each request's code here was written for, [lo, hi]; a request uses the highest of
 * them that the broker (and the codec) supports, km_net_client_version. lo is the first with what
 * the code needs (Metadata 10: topic ids; Produce 3 and Fetch 4: v2 record batches), hi the last
 * naming topics by name (Produce 13 and Fetch 13 name them by id) or the last whose new fields the
 * code has looked at (DescribeConfigs: the codec's range; only a config's name and value are read).
 */
static const struct {
	int16_t key, lo, hi;
	const char *name;
} versions[] = {
	{KM_API_METADATA, 10, 13, "Metadata"},   {KM_API_CREATE_TOPICS, 2, 7, "CreateTopics"},
	{KM_API_INIT_PRODUCER_ID, 0, 5, "InitProducerId"}, {KM_API_PRODUCE, 3, 12, "Produce"},
	{KM_API_LIST_OFFSETS, 1, 10, "ListOffsets"}, {KM_API_FETCH, 4, 12, "Fetch"},
	{KM_API_DESCRIBE_CONFIGS, 1, 4, "DescribeConfigs"},
};

/* ---- plumbing ---- */

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	km_state_persist *io = arg;
	void (*fn)(km_state_persist *) = io->timer_fn;
	(void)fd;
	(void)what;
	io->timer_fn = NULL;
	if (fn)
		fn(io);
}

void km_ps_after(km_state_persist *io, int ms, void (*fn)(km_state_persist *))
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	io->wait_c = NULL; /* the next step supersedes any wait */
	io->down = false;
	io->timer_fn = fn;
	event_add(io->timer, &tv);
}

int km_ps_next_backoff(int *backoff_ms)
{
	int ms = *backoff_ms ? *backoff_ms : BACKOFF_MIN_MS;
	*backoff_ms = ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ms * 2;
	return ms;
}

/*
 * The cluster's word that one of its clients became ready or failed (on a later loop iteration
 * than the client's own callback, so a step may drop clients). A step waiting for its client goes on.
 */
static void on_change(void *arg)
{
	km_state_persist *io = arg;
	km_net_client *c = io->wait_c;
	bool failed;

	if (io->closing || !c)
		return;
	/* Failed first: it only compares c, which the cluster may have freed (no longer its own). */
	failed = km_cluster_failed(io->cl, c);
	if (!failed && !km_net_client_ready(c))
		return;
	io->wait_c = NULL;
	/* Continue on the next loop iteration, as every step does after a wait. */
	km_ps_after(io, 0, io->wait_fn);
	if (failed) {
		/* The resumed step's send fails (no client), so its error path runs and backs off. */
		io->down = true;
		io->down_id = io->wait_id;
		io->down_gen = io->gen;
	}
}

/*
 * Whether c has negotiated its versions (or can never: send then fails and the step's error path
 * runs). When not yet, resume runs once it has, or the step's phase fails if it cannot connect.
 */
bool km_ps_client_wait(km_state_persist *io, km_net_client *c, int32_t id, void (*resume)(km_state_persist *io))
{
	if (!c || km_cluster_failed(io->cl, c) || km_net_client_ready(c))
		return true;
	io->wait_c = c;
	io->wait_id = id;
	io->wait_fn = resume;
	return false;
}

/* The version of key to speak on c (ready), or -1 (logged, with why in why) when the broker is too old. */
int16_t km_ps_version_for(km_net_client *c, int16_t key, char *why, size_t len)
{
	int16_t both = km_net_client_version(c, key), v = -1;

	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		if (versions[i].key != key)
			continue;
		v = km_net_version_pick(c, key, versions[i].lo, versions[i].hi);
		if (v < 0) {
			if (both < 0)
				snprintf(why, len, "the destination broker does not support %s; the state store needs v%d to v%d",
					 versions[i].name, versions[i].lo, versions[i].hi);
			else
				snprintf(why, len, "the destination broker supports %s up to v%d; the state store needs v%d to v%d",
					 versions[i].name, both, versions[i].lo, versions[i].hi);
			KM_ERROR(COMP, 0, "%s", why);
		}
		return v;
	}
	snprintf(why, len, "no version range for API key %d", key);
	return -1;
}

/* Whether the step resumed after the failure of broker id's waited client is asking for it again. */
static bool is_down(km_state_persist *io, int32_t id)
{
	return io->down && io->down_gen == io->gen && io->down_id == id;
}

km_net_client *km_ps_any(km_state_persist *io)
{
	return is_down(io, KM_PS_ANY) ? NULL : km_cluster_any(io->cl);
}

km_net_client *km_ps_node(km_state_persist *io, int32_t id)
{
	return is_down(io, id) ? NULL : km_cluster_node(io->cl, id);
}

void km_ps_drop(km_state_persist *io, km_net_client *c)
{
	if (!c)
		return;
	if (io->wait_c == c)
		io->wait_c = NULL;
	km_cluster_drop(io->cl, c);
}

static km_err send_req(km_state_persist *io, km_net_client *c, int16_t key, int16_t ver, const void *req, km_rpc_cb cb,
		       int32_t node_id, int32_t partition, bool follow)
{
	req_ctx *x;
	km_err rc;

	/* Not ready after its wait: its connection failed, and it never will be. */
	if (!c || !km_net_client_ready(c))
		return KM_ERR_CLOSED;
	if (!(x = malloc(sizeof(*x))))
		return KM_ERR_NOMEM;
	*x = (req_ctx){io, follow ? io->fgen : io->gen, follow, node_id, partition};
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++)
		if (versions[i].key == key)
			io->used[i] = ver;
	rc = km_rpc_call(c, key, ver, req, NULL, cb, x);
	if (rc != KM_OK)
		free(x);
	return rc;
}

km_err km_ps_send_req(km_state_persist *io, km_net_client *c, int16_t key, int16_t ver, const void *req,
		      km_rpc_cb cb, int32_t node_id, int32_t partition)
{
	return send_req(io, c, key, ver, req, cb, node_id, partition, false);
}

km_err km_ps_send_follow_req(km_state_persist *io, km_net_client *c, int16_t key, int16_t ver, const void *req,
			     km_rpc_cb cb, int32_t node_id)
{
	return send_req(io, c, key, ver, req, cb, node_id, -1, true);
}

/* The context of an answer, or NULL when it belongs to an operation since restarted (or to shutdown). */
km_state_persist *km_ps_ctx_take(void *arg, req_ctx *out)
{
	req_ctx *x = arg;
	km_state_persist *io = x->io;
	*out = *x;
	free(x);
	if (io->closing || out->gen != (out->follow ? io->fgen : io->gen))
		return NULL;
	return io;
}

/* ---- metadata of the state topic ---- */

km_err km_ps_send_metadata(km_state_persist *io, km_net_client *c, int16_t ver, char *const *names, size_t n,
			   km_rpc_cb cb)
{
	km_metadata_request m;
	km_metadata_request_topic *t = calloc(n ? n : 1, sizeof(*t));
	km_err rc;

	if (!t)
		return KM_ERR_NOMEM;
	km_metadata_request_init(&m);
	m.allow_auto_topic_creation = false;
	for (size_t i = 0; i < n; i++) {
		km_metadata_request_topic_init(&t[i]);
		t[i].name = km_str_c(names[i]);
	}
	m.topics.items = t;
	m.topics.count = (int32_t)n;
	rc = km_ps_send_req(io, c, KM_API_METADATA, ver, &m, cb, -1, -1);
	free(t);
	return rc;
}

/* Takes the brokers and the state topic's layout from a Metadata response. KM_OK when leaders are all known. */
km_err km_ps_take_metadata(km_state_persist *io, const km_metadata_response *r, int16_t *topic_err)
{
	const km_metadata_response_topic *t = NULL;
	const char *host;
	uint16_t port;
	km_err rc;

	if (r->error_code) {
		*topic_err = r->error_code; /* v13+: the whole request failed; callers retry as for the topic's error */
		io->exists = false;
		return KM_OK;
	}
	/* The cluster keeps the clients of brokers whose address did not change. */
	if ((rc = km_cluster_brokers(io->cl, r)) != KM_OK)
		return rc;
	for (int32_t i = 0; i < r->topics.count; i++)
		if (km_str_eq_c(r->topics.items[i].name, io->st->cfg.mirror_state_topic))
			t = &r->topics.items[i];
	*topic_err = t ? t->error_code : K_ERR_UNKNOWN_TOPIC;
	if (!t || t->error_code != 0) {
		io->exists = false;
		return KM_OK;
	}
	io->st->store_topic_id = t->topic_id; /* for the proxy: clients never write it by id either */
	int32_t np = t->partitions.count;
	if (np <= 0 || np > 100000)
		return KM_ERR_DECODE;
	int32_t *leaders = calloc((size_t)np, sizeof(*leaders));
	if (!leaders)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < np; i++)
		leaders[i] = -1;
	for (int32_t i = 0; i < np; i++) {
		const km_metadata_response_partition *p = &t->partitions.items[i];
		if (p->partition_index >= 0 && p->partition_index < np && p->error_code == 0)
			leaders[p->partition_index] = p->leader_id;
	}
	if (np != io->nparts) {
		/* A new layout: sequence numbers are per partition; a new producer id starts them over. */
		free(io->seq);
		io->seq = calloc((size_t)np, sizeof(*io->seq));
		io->pid = -1;
		if (!io->seq) {
			free(leaders);
			return KM_ERR_NOMEM;
		}
	}
	free(io->leaders);
	io->leaders = leaders;
	io->nparts = np;
	io->exists = true;
	for (int32_t i = 0; i < np; i++)
		if (leaders[i] < 0 || !km_cluster_addr(io->cl, leaders[i], &host, &port))
			return KM_ERR_UNSUPPORTED; /* a leader not known yet */
	return KM_OK;
}

/* ---- life ---- */

SSL_CTX *km_state_upstream_tls(const km_config *cfg, bool identity, char *err, size_t errlen)
{
	km_net_tls_files f = {
		.ca_file = cfg->upstream_tls_ca_file,
		.truststore = {.location = cfg->upstream_tls_truststore_file,
			       .password = cfg->upstream_tls_truststore_password},
	};

	if (identity) {
		f.cert_file = cfg->upstream_tls_cert_file;
		f.key_file = cfg->upstream_tls_key_file;
		f.keystore = (km_net_tls_store){.location = cfg->upstream_tls_keystore_file,
						.password = cfg->upstream_tls_keystore_password};
	}
	return km_net_tls_client_ctx(&f, true, err, errlen);
}

/* The destination as kmirrord itself (upstream, upstream_tls*, upstream_sasl_*); on_change(io) as the cluster's. */
km_cluster *km_ps_cluster_new(km_state_persist *io, void (*changed)(void *arg))
{
	const km_config *cfg = &io->st->cfg;
	km_net_client_opts o;

	memset(&o, 0, sizeof(o));
	o.client_id = "kmirror-state";
	o.tls = io->st->tls;
	km_net_client_opts_upstream(&o, cfg);
	o.connect_timeout_ms = cfg->upstream_connect_timeout_ms;
	o.request_timeout_ms = 40000; /* above the Produce timeout (30 s) */
	o.max_frame_bytes = FETCH_BYTES + (1 << 20);
	o.dns = io->st->dns;
	return km_cluster_new(io->st->base, "destination", &o, cfg->upstream, (size_t)cfg->upstream_count, changed, io);
}

km_state_persist *km_state_persist_new(km_state *st)
{
	km_state_persist *io = calloc(1, sizeof(*io));
	if (!io)
		return NULL;
	io->st = st;
	io->pid = -1;
	for (size_t i = 0; i < sizeof(io->used) / sizeof(io->used[0]); i++)
		io->used[i] = -1;
	io->epoch = -1;
	io->foldest_ms = -1;
	io->timer = evtimer_new(st->base, on_timer, io);
	io->cl = io->timer ? km_ps_cluster_new(io, on_change) : NULL;
	if (!io->cl) {
		if (io->timer)
			event_free(io->timer);
		free(io);
		return NULL;
	}
	return io;
}

void km_state_persist_free(km_state_persist *io)
{
	/* Answers that the clients give while closing see closing and are dropped. */
	io->closing = true;
	event_free(io->timer);
	km_ps_follow_free(io);
	km_cluster_free(io->cl);
	km_ps_map_clear(io);
	free(io->scratch);
	free(io->leaders);
	free(io->seq);
	free(io->rpart);
	free(io->pdone);
	free(io->pcount);
	for (size_t i = 0; i < io->mn; i++)
		free(io->mnames[i]);
	free(io->mnames);
	free(io);
}
