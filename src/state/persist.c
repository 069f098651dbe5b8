/* The state store's I/O against the destination: reading __mirror_state back, creating it, and writing records as an idempotent producer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/api.h"
#include "kmirror/arena.h"
#include "kmirror/batch.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_topics_request.h"
#include "kmirror/msg/create_topics_response.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/init_producer_id_request.h"
#include "kmirror/msg/init_producer_id_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/msg/produce_request.h"
#include "kmirror/msg/produce_response.h"
#include "kmirror/net.h"
#include "state/state_int.h"

#define COMP "state"

/*
 * The versions each request's code here was written for, [lo, hi]; a request uses the highest of
 * them that the broker (and the codec) supports, km_net_client_version. lo is the first with what
 * the code needs (Metadata 10: topic ids; Produce 3 and Fetch 4: v2 record batches), hi the last
 * naming topics by name (Produce 13 and Fetch 13 name them by id) or the last whose new fields the
 * code has looked at.
 */
static const struct {
	int16_t key, lo, hi;
	const char *name;
} versions[] = {
	{KM_API_METADATA, 10, 13, "Metadata"},   {KM_API_CREATE_TOPICS, 2, 7, "CreateTopics"},
	{KM_API_INIT_PRODUCER_ID, 0, 5, "InitProducerId"}, {KM_API_PRODUCE, 3, 12, "Produce"},
	{KM_API_LIST_OFFSETS, 1, 10, "ListOffsets"}, {KM_API_FETCH, 4, 12, "Fetch"},
};

#define MAX_NODES 1024
#define FETCH_BYTES (8 << 20)
#define SCRATCH_BYTES (64 << 20)  /* a compressed state batch decompressed */
#define WRITE_ATTEMPTS 6
#define META_ATTEMPTS 20
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 10000

enum {
	K_ERR_NOT_LEADER = 6,
	K_ERR_TIMED_OUT = 7,
	K_ERR_LEADER_NOT_AVAILABLE = 5,
	K_ERR_NOT_ENOUGH_REPLICAS = 19,
	K_ERR_NOT_ENOUGH_REPLICAS_AFTER = 20,
	K_ERR_TOPIC_EXISTS = 36,
	K_ERR_DUPLICATE_SEQ = 46,
	K_ERR_NOT_CONTROLLER = 41,
	K_ERR_COORD_NOT_AVAILABLE = 15,
	K_ERR_COORD_LOADING = 14,
	K_ERR_NOT_COORD = 16,
	K_ERR_UNKNOWN_TOPIC = 3,
	K_ERR_FENCED_LEADER_EPOCH = 74,
	K_ERR_UNKNOWN_LEADER_EPOCH = 75,
	K_ERR_OFFSET_NOT_AVAILABLE = 78,
};

typedef struct node {
	int32_t id;
	char host[256];
	uint16_t port;
	km_net_client *c;
	bool failed;               /* c's connection failed or closed: it never becomes ready */
} node;

/* One key's latest value while loading (key bytes -> value bytes or tombstone). */
typedef struct load_entry {
	uint8_t *key, *val;
	size_t klen, vlen;
	bool tomb;
	uint32_t hash;
	struct load_entry *next;
} load_entry;

typedef enum { PH_IDLE, PH_LOAD, PH_WRITE, PH_META } phase;

struct km_state_persist {
	km_state *st;
	bool closing;
	uint64_t gen;              /* bumps when an operation restarts: late answers of the old one are dropped */
	km_net_client *boot;
	int boot_index;
	node *nodes;
	size_t nnodes;
	int32_t nbrokers;
	bool exists;
	int32_t nparts;
	int32_t *leaders;
	int64_t pid;
	int16_t epoch;
	int32_t *seq;
	struct event *timer;
	void (*timer_fn)(km_state_persist *io);
	/* a step waiting for its client's ApiVersions (the versions it encodes with) */
	km_net_client *wait_c;
	void (*wait_fn)(km_state_persist *io);
	bool boot_failed;
	int16_t used[6];           /* the last version sent of each key of versions[] (-1: none yet) */
	int64_t lts;               /* the ListOffsets timestamp being asked (-2 earliest, -1 latest) */
	int backoff_ms;
	phase ph;
	bool load_wanted;          /* a reload was asked while a write finished */
	/* load */
	int32_t lpart;
	int64_t lo, hi, next;
	int empty_fetches;
	load_entry **map;
	size_t mapn, mapcount;
	uint8_t *scratch;
	size_t nrecords;
	struct timeval load_start;
	/* write */
	const km_state_rec *recs;
	size_t nrecs;
	km_state_write_cb wcb;
	int attempts;
	int32_t *rpart;            /* partition of each record */
	int32_t layout_parts;      /* nparts when rpart/pdone were computed */
	bool *pdone;               /* per state partition: acknowledged (or not part of the write) */
	int32_t *pcount;           /* records per partition */
	size_t outstanding;
	bool wfail;                /* a non-retriable error was seen */
	bool wretry;
	char wmsg[512];
	/* topics metadata */
	char **mnames;
	size_t mn;
	km_state_meta_cb mcb;
};

typedef struct req_ctx {
	km_state_persist *io;
	uint64_t gen;
	int32_t node_id;
	int32_t partition;
	int16_t ver;               /* the version the request was encoded with: its response decodes with it */
} req_ctx;

static void start_load(km_state_persist *io);
static void write_step(km_state_persist *io);
static void write_produce(km_state_persist *io);

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

static void after(km_state_persist *io, int ms, void (*fn)(km_state_persist *))
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	io->wait_c = NULL; /* the next step supersedes any wait */
	io->timer_fn = fn;
	event_add(io->timer, &tv);
}

static int next_backoff(km_state_persist *io)
{
	int ms = io->backoff_ms ? io->backoff_ms : BACKOFF_MIN_MS;
	io->backoff_ms = ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ms * 2;
	return ms;
}

static void on_client_state(km_net_client *c, km_err err, void *arg)
{
	km_state_persist *io = arg;

	if (io->closing)
		return;
	if (err != KM_OK) {
		KM_DEBUG(COMP, 0, "destination connection failed: %s", km_err_name(err));
		if (c == io->boot)
			io->boot_failed = true;
		for (size_t i = 0; i < io->nnodes; i++)
			if (io->nodes[i].c == c)
				io->nodes[i].failed = true;
	}
	if (c != io->wait_c)
		return;
	/* Continue on the next loop iteration: the step may free this client, which is calling us. */
	/* On failure too: the client is marked failed, so the step's send fails and its error path retries. */
	io->wait_c = NULL;
	after(io, 0, io->wait_fn);
}

/*
 * Whether c has negotiated its versions (or can never: send then fails and the step's error path
 * runs). When not yet, resume runs once it has, or the step's phase fails if it cannot connect.
 */
static bool client_wait(km_state_persist *io, km_net_client *c, void (*resume)(km_state_persist *io))
{
	bool failed = c == io->boot && io->boot_failed;

	for (size_t i = 0; c && i < io->nnodes; i++)
		if (io->nodes[i].c == c && io->nodes[i].failed)
			failed = true;
	if (!c || failed || km_net_client_ready(c))
		return true;
	io->wait_c = c;
	io->wait_fn = resume;
	return false;
}

int16_t km_state_version_pick(int16_t both, int16_t lo, int16_t hi)
{
	if (both < lo)
		return -1;
	return both > hi ? hi : both;
}

/* The version of key to speak on c (ready), or -1 (logged, with why in why) when the broker is too old. */
static int16_t version_for(km_net_client *c, int16_t key, char *why, size_t len)
{
	int16_t both = km_net_client_version(c, key), v = -1;

	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		if (versions[i].key != key)
			continue;
		v = km_state_version_pick(both, versions[i].lo, versions[i].hi);
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

static km_net_client *client_to(km_state_persist *io, const char *host, uint16_t port)
{
	const km_config *cfg = &io->st->cfg;
	km_net_client_opts o;
	km_net_client *c;

	memset(&o, 0, sizeof(o));
	o.client_id = "kmirror-state";
	o.tls = io->st->tls;
	o.tls_verify_host = cfg->upstream_tls_verify_hostname;
	o.sasl_mechanism = cfg->upstream_sasl_mechanism;
	o.sasl_username = cfg->upstream_sasl_username;
	o.sasl_password = cfg->upstream_sasl_password;
	o.connect_timeout_ms = cfg->upstream_connect_timeout_ms;
	o.request_timeout_ms = 40000; /* above the Produce timeout (30 s) */
	o.max_frame_bytes = FETCH_BYTES + (1 << 20);
	o.dns = io->st->dns;
	o.on_state = on_client_state;
	o.arg = io;
	c = km_net_client_new(io->st->base, &o);
	if (c && km_net_client_connect(c, host, port) != KM_OK) {
		km_net_client_free(c);
		c = NULL;
	}
	return c;
}

static km_net_client *boot(km_state_persist *io)
{
	if (!io->boot) {
		const km_hostport *hp = &io->st->cfg.upstream[io->boot_index % io->st->cfg.upstream_count];
		io->boot = client_to(io, hp->host, hp->port);
	}
	return io->boot;
}

static void drop_boot(km_state_persist *io)
{
	if (io->boot) {
		km_net_client *c = io->boot;
		io->boot = NULL;
		if (io->wait_c == c)
			io->wait_c = NULL;
		km_net_client_free(c);
	}
	io->boot_failed = false;
	io->boot_index++;
}

static node *node_of(km_state_persist *io, int32_t id)
{
	for (size_t i = 0; i < io->nnodes; i++)
		if (io->nodes[i].id == id)
			return &io->nodes[i];
	return NULL;
}

static km_net_client *leader_client(km_state_persist *io, int32_t id)
{
	node *n = node_of(io, id);
	if (!n)
		return NULL;
	if (!n->c)
		n->c = client_to(io, n->host, n->port);
	return n->c;
}

static void drop_node(km_state_persist *io, int32_t id)
{
	node *n = node_of(io, id);
	if (n && n->c) {
		km_net_client *c = n->c;
		n->c = NULL;
		if (io->wait_c == c)
			io->wait_c = NULL;
		km_net_client_free(c);
	}
	if (n)
		n->failed = false;
}

static km_err send_req(km_state_persist *io, km_net_client *c, int16_t key, int16_t ver, km_wr *w, km_net_response_cb cb,
		   int32_t node_id, int32_t partition)
{
	km_net_request rq;
	km_net_piece pc = {.p = w->buf, .len = w->len};
	req_ctx *x;
	km_err rc;

	if (!km_wr_ok(w))
		return w->err;
	if (!c)
		return KM_ERR_CLOSED;
	if (!(x = malloc(sizeof(*x))))
		return KM_ERR_NOMEM;
	*x = (req_ctx){io, io->gen, node_id, partition, ver};
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++)
		if (versions[i].key == key)
			io->used[i] = ver;
	km_net_request_init(&rq, key, ver);
	rq.pieces = &pc;
	rq.npieces = 1;
	rq.delivery = KM_NET_FLAT;
	rq.on_flat = cb;
	rq.arg = x;
	rc = km_net_client_request(c, &rq);
	if (rc != KM_OK)
		free(x);
	return rc;
}

/* The context of an answer, or NULL when it belongs to an operation since restarted (or to shutdown). */
static km_state_persist *ctx_take(void *arg, req_ctx *out)
{
	req_ctx *x = arg;
	km_state_persist *io = x->io;
	*out = *x;
	free(x);
	if (io->closing || out->gen != io->gen)
		return NULL;
	return io;
}

/* ---- metadata of the state topic ---- */

static void encode_metadata(km_wr *w, int16_t ver, char *const *names, size_t n)
{
	km_metadata_request m;
	km_metadata_request_topic *t = calloc(n ? n : 1, sizeof(*t));

	km_metadata_request_init(&m);
	m.allow_auto_topic_creation = false;
	for (size_t i = 0; t && i < n; i++) {
		km_metadata_request_topic_init(&t[i]);
		t[i].name = km_str_c(names[i]);
	}
	m.topics.items = t;
	m.topics.count = t ? (int32_t)n : 0;
	km_wr_init(w);
	km_metadata_request_encode(w, ver, &m);
	if (!t)
		w->err = KM_ERR_NOMEM;
	free(t);
}

/* Takes the brokers and the state topic's layout from a Metadata response. KM_OK when leaders are all known. */
static km_err take_metadata(km_state_persist *io, const km_metadata_response *r, int16_t *topic_err)
{
	const km_metadata_response_topic *t = NULL;
	node *nn;
	size_t n = r->brokers.count > 0 ? (size_t)r->brokers.count : 0;

	if (r->error_code) {
		*topic_err = r->error_code; /* v13+: the whole request failed; callers retry as for the topic's error */
		io->exists = false;
		return KM_OK;
	}
	if (n > MAX_NODES)
		n = MAX_NODES;
	/* Keep the clients of brokers whose address did not change. */
	nn = calloc(n ? n : 1, sizeof(*nn));
	if (!nn)
		return KM_ERR_NOMEM;
	for (size_t i = 0; i < n; i++) {
		const km_metadata_response_broker *b = &r->brokers.items[i];
		node *old = node_of(io, b->node_id);
		nn[i].id = b->node_id;
		snprintf(nn[i].host, sizeof(nn[i].host), "%.*s", b->host.len > 0 ? (int)b->host.len : 0, b->host.p);
		nn[i].port = (uint16_t)b->port;
		if (old && old->c && !strcmp(old->host, nn[i].host) && old->port == nn[i].port) {
			nn[i].c = old->c;
			nn[i].failed = old->failed;
			old->c = NULL;
		}
	}
	for (size_t i = 0; i < io->nnodes; i++)
		if (io->nodes[i].c)
			km_net_client_free(io->nodes[i].c);
	free(io->nodes);
	io->nodes = nn;
	io->nnodes = n;
	io->nbrokers = (int32_t)n;
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
		if (leaders[i] < 0 || !node_of(io, leaders[i]))
			return KM_ERR_UNSUPPORTED; /* a leader not known yet */
	return KM_OK;
}

/* ---- load ---- */

static void map_clear(km_state_persist *io)
{
	for (size_t i = 0; i < io->mapn; i++) {
		load_entry *e = io->map ? io->map[i] : NULL;
		while (e) {
			load_entry *n = e->next;
			free(e->key);
			free(e->val);
			free(e);
			e = n;
		}
	}
	free(io->map);
	io->map = NULL;
	io->mapn = io->mapcount = 0;
}

static km_err map_put(km_state_persist *io, km_bytes key, km_bytes val)
{
	uint32_t h = km_state_murmur2(key.p, (size_t)key.len);
	load_entry *e;

	if (io->mapcount >= io->mapn) {
		size_t nn = io->mapn ? io->mapn * 2 : 1024;
		load_entry **nm = calloc(nn, sizeof(*nm));
		if (!nm)
			return KM_ERR_NOMEM;
		for (size_t i = 0; i < io->mapn; i++)
			for (load_entry *x = io->map[i], *nx; x; x = nx) {
				nx = x->next;
				x->next = nm[x->hash % nn];
				nm[x->hash % nn] = x;
			}
		free(io->map);
		io->map = nm;
		io->mapn = nn;
	}
	for (e = io->map[h % io->mapn]; e; e = e->next)
		if (e->hash == h && e->klen == (size_t)key.len && !memcmp(e->key, key.p, e->klen))
			break;
	if (!e) {
		if (!(e = calloc(1, sizeof(*e))) || !(e->key = malloc((size_t)key.len + 1))) {
			free(e);
			return KM_ERR_NOMEM;
		}
		memcpy(e->key, key.p, (size_t)key.len);
		e->klen = (size_t)key.len;
		e->hash = h;
		e->next = io->map[h % io->mapn];
		io->map[h % io->mapn] = e;
		io->mapcount++;
	}
	free(e->val);
	e->val = NULL;
	e->vlen = 0;
	e->tomb = val.len < 0;
	if (!e->tomb) {
		if (!(e->val = malloc((size_t)val.len + 1)))
			return KM_ERR_NOMEM;
		memcpy(e->val, val.p, (size_t)val.len);
		e->vlen = (size_t)val.len;
	}
	return KM_OK;
}

static void load_retry(km_state_persist *io, const char *why)
{
	int ms = next_backoff(io);
	KM_WARN(COMP, 0, "reading %s from the destination failed (%s); retrying in %d ms", io->st->cfg.mirror_state_topic,
		why, ms);
	io->gen++;
	after(io, ms, start_load);
}

static void load_finish(km_state_persist *io)
{
	km_state_model m;
	struct timeval now;
	size_t bad = 0;

	km_state_model_init(&m);
	/*
	 * Mirrors first, then partitions, then runs: a partition record names a mirror, and a run a
	 * topic, whose records may sit in other partitions of the state topic (read in any order).
	 */
	for (int pass = 0; pass < 3; pass++)
		for (size_t i = 0; i < io->mapn; i++)
			for (load_entry *e = io->map[i]; e; e = e->next) {
				km_state_change chg;
				int16_t type = e->klen >= 2 ? (int16_t)km_be16(e->key) : -1;
				int want = type == KM_STATE_REC_MIRROR ? 0 : type == KM_STATE_REC_RUN ? 2 : 1;
				if (want != pass)
					continue;
				if (km_state_model_apply(&m, e->key, e->klen, e->val, e->vlen, e->tomb, &chg) != KM_OK)
					bad++;
			}
	if (km_state_model_index(&m) != KM_OK) {
		km_state_model_free(&m);
		load_retry(io, "out of memory");
		return;
	}
	gettimeofday(&now, NULL);
	KM_INFO(COMP, 0, "read %s: %d partitions, %zu records, %zu keys, %zu unreadable, in %ld ms (Metadata v%d, "
		"ListOffsets v%d, Fetch v%d)",
		io->st->cfg.mirror_state_topic, io->exists ? io->nparts : 0, io->nrecords, io->mapcount, bad,
		(long)((now.tv_sec - io->load_start.tv_sec) * 1000 + (now.tv_usec - io->load_start.tv_usec) / 1000),
		io->used[0], io->used[4], io->used[5]);
	io->st->ctr.loads++;
	io->st->ctr.records_loaded += io->nrecords;
	io->st->ctr.load_ms = (uint64_t)((now.tv_sec - io->load_start.tv_sec) * 1000 +
					 (now.tv_usec - io->load_start.tv_usec) / 1000);
	map_clear(io);
	free(io->scratch);
	io->scratch = NULL;
	io->ph = PH_IDLE;
	io->backoff_ms = 0;
	km_state_loaded(io->st, &m);
}

static void load_partition(km_state_persist *io);

static void on_fetch(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_fetch_response r;
	km_arena a;
	km_rd rd;
	km_batch_iter it;
	km_batch b;
	const km_fetch_response_partition_data *pd = NULL;
	int64_t before;
	char why[160];

	(void)c;
	if (!io)
		return;
	if (err != KM_OK) {
		drop_node(io, x.node_id);
		load_retry(io, km_err_name(err));
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	if (km_fetch_response_decode(&rd, x.ver, &r, &a) != KM_OK || r.responses.count != 1 ||
	    r.responses.items[0].partitions.count != 1) {
		km_arena_free(&a);
		load_retry(io, "undecodable Fetch response");
		return;
	}
	pd = &r.responses.items[0].partitions.items[0];
	if (r.error_code || pd->error_code) {
		snprintf(why, sizeof(why), "Fetch partition %d: %s", io->lpart,
			 km_err_name(r.error_code ? r.error_code : pd->error_code));
		km_arena_free(&a);
		load_retry(io, why);
		return;
	}
	before = io->next;
	km_batch_iter_init(&it, pd->records.p, pd->records.len > 0 ? (size_t)pd->records.len : 0);
	while (km_batch_next(&it, &b)) {
		km_record_iter ri;
		km_record rec;
		int64_t last = b.base_offset + b.last_offset_delta;
		if (last < io->next)
			continue;
		if (!b.control) {
			if (b.codec != KM_CODEC_NONE && !io->scratch && !(io->scratch = malloc(SCRATCH_BYTES))) {
				km_arena_free(&a);
				load_retry(io, "out of memory");
				return;
			}
			if (km_batch_records(&b, io->scratch, SCRATCH_BYTES, &ri) != KM_OK) {
				km_arena_free(&a);
				load_retry(io, "undecodable batch");
				return;
			}
			while (km_record_next(&ri, &rec)) {
				if (rec.offset < io->next || rec.offset >= io->hi || rec.key.len < 2)
					continue;
				io->nrecords++;
				if (map_put(io, rec.key, rec.value) != KM_OK) {
					km_arena_free(&a);
					load_retry(io, "out of memory");
					return;
				}
			}
			if (ri.err != KM_OK) {
				km_arena_free(&a);
				load_retry(io, "undecodable records");
				return;
			}
		}
		io->next = last + 1;
	}
	km_arena_free(&a);
	if (io->next == before) {
		/* Nothing below the end: compaction may leave the end past the last record. */
		if (++io->empty_fetches > 3)
			io->next = io->hi;
	} else {
		io->empty_fetches = 0;
	}
	load_partition(io);
}

static void fetch_next(km_state_persist *io)
{
	km_fetch_request m;
	km_fetch_request_fetch_topic t;
	km_fetch_request_fetch_partition p;
	km_wr w;
	km_err rc;
	int32_t leader = io->leaders[io->lpart];
	km_net_client *c = leader_client(io, leader);
	int16_t ver = 0;
	char why[200];

	if (!client_wait(io, c, fetch_next))
		return;
	if (c && km_net_client_ready(c) && (ver = version_for(c, KM_API_FETCH, why, sizeof(why))) < 0) {
		load_retry(io, why);
		return;
	}
	km_fetch_request_init(&m);
	km_fetch_request_fetch_topic_init(&t);
	km_fetch_request_fetch_partition_init(&p);
	m.max_wait_ms = 100;
	m.min_bytes = 1;
	m.max_bytes = FETCH_BYTES;
	m.isolation_level = 0;
	p.partition = io->lpart;
	p.fetch_offset = io->next;
	p.partition_max_bytes = FETCH_BYTES;
	t.topic = km_str_c(io->st->cfg.mirror_state_topic);
	t.partitions.items = &p;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	km_wr_init(&w);
	km_fetch_request_encode(&w, ver, &m);
	rc = send_req(io, c, KM_API_FETCH, ver, &w, on_fetch, leader, io->lpart);
	km_wr_free(&w);
	if (rc != KM_OK)
		load_retry(io, km_err_name(rc));
}

static void list_offsets(km_state_persist *io, int64_t ts);
static void list_offsets_again(km_state_persist *io)
{
	list_offsets(io, io->lts);
}

static void on_list_offsets(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_list_offsets_response r;
	km_arena a;
	km_rd rd;
	char why[160];

	(void)c;
	if (!io)
		return;
	if (err != KM_OK) {
		drop_node(io, x.node_id);
		load_retry(io, km_err_name(err));
		return;
	}
	km_arena_init(&a, 1 << 20);
	km_rd_init(&rd, body, len);
	if (km_list_offsets_response_decode(&rd, x.ver, &r, &a) != KM_OK || r.topics.count != 1 ||
	    r.topics.items[0].partitions.count != 1) {
		km_arena_free(&a);
		load_retry(io, "undecodable ListOffsets response");
		return;
	}
	const km_list_offsets_response_list_offsets_partition_response *p = &r.topics.items[0].partitions.items[0];
	if (p->error_code) {
		snprintf(why, sizeof(why), "ListOffsets partition %d: %s", io->lpart, km_err_name(p->error_code));
		km_arena_free(&a);
		load_retry(io, why);
		return;
	}
	if (x.partition == -2) { /* earliest */
		io->lo = p->offset;
		km_arena_free(&a);
		list_offsets(io, -1);
		return;
	}
	io->hi = p->offset;
	io->next = io->lo;
	io->empty_fetches = 0;
	km_arena_free(&a);
	load_partition(io);
}

static void list_offsets(km_state_persist *io, int64_t ts)
{
	km_list_offsets_request m;
	km_list_offsets_request_list_offsets_topic t;
	km_list_offsets_request_list_offsets_partition p;
	km_wr w;
	km_err rc;
	int32_t leader = io->leaders[io->lpart];
	km_net_client *c = leader_client(io, leader);
	int16_t ver = 0;
	char why[200];

	io->lts = ts;
	if (!client_wait(io, c, list_offsets_again))
		return;
	if (c && km_net_client_ready(c) && (ver = version_for(c, KM_API_LIST_OFFSETS, why, sizeof(why))) < 0) {
		load_retry(io, why);
		return;
	}
	km_list_offsets_request_init(&m);
	km_list_offsets_request_list_offsets_topic_init(&t);
	km_list_offsets_request_list_offsets_partition_init(&p);
	m.replica_id = -1;
	m.isolation_level = 0;
	m.timeout_ms = 30000; /* v10+: remote (tiered) offsets */
	p.partition_index = io->lpart;
	p.timestamp = ts;
	t.name = km_str_c(io->st->cfg.mirror_state_topic);
	t.partitions.items = &p;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	km_wr_init(&w);
	km_list_offsets_request_encode(&w, ver, &m);
	/* The partition field of the context says which of the two answers this is. */
	rc = send_req(io, c, KM_API_LIST_OFFSETS, ver, &w, on_list_offsets, leader,
		  ts == -2 ? -2 : -1);
	km_wr_free(&w);
	if (rc != KM_OK)
		load_retry(io, km_err_name(rc));
}

/* Continue with the current partition, or the next one, or finish. */
static void load_partition(km_state_persist *io)
{
	if (io->lpart >= 0 && io->next < io->hi) {
		fetch_next(io);
		return;
	}
	io->lpart++;
	if (io->lpart >= io->nparts) {
		load_finish(io);
		return;
	}
	io->lo = io->hi = io->next = 0;
	list_offsets(io, -2);
}

static void on_load_metadata(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_metadata_response r;
	km_arena a;
	km_rd rd;
	int16_t terr;
	km_err rc;

	(void)c;
	if (!io)
		return;
	if (err != KM_OK) {
		drop_boot(io);
		load_retry(io, km_err_name(err));
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	rc = km_metadata_response_decode(&rd, x.ver, &r, &a);
	if (rc == KM_OK)
		rc = take_metadata(io, &r, &terr);
	km_arena_free(&a);
	if (rc != KM_OK) {
		load_retry(io, rc == KM_ERR_UNSUPPORTED ? "a partition has no leader" : km_err_name(rc));
		return;
	}
	if (!io->exists) {
		if (terr != K_ERR_UNKNOWN_TOPIC) {
			load_retry(io, km_err_name(terr));
			return;
		}
		KM_INFO(COMP, 0, "%s does not exist on the destination yet: no mirrors", io->st->cfg.mirror_state_topic);
		load_finish(io);
		return;
	}
	io->lpart = -1;
	load_partition(io);
}

static void load_metadata(km_state_persist *io)
{
	km_wr w;
	km_err rc;
	char *name = io->st->cfg.mirror_state_topic;
	km_net_client *c = boot(io);
	int16_t ver = 0;
	char why[200];

	if (!client_wait(io, c, load_metadata))
		return;
	if (c && km_net_client_ready(c) && (ver = version_for(c, KM_API_METADATA, why, sizeof(why))) < 0) {
		load_retry(io, why);
		return;
	}
	encode_metadata(&w, ver, &name, 1);
	rc = send_req(io, c, KM_API_METADATA, ver, &w, on_load_metadata, -1, -1);
	km_wr_free(&w);
	if (rc != KM_OK) {
		drop_boot(io);
		load_retry(io, km_err_name(rc));
	}
}

static void start_load(km_state_persist *io)
{
	io->ph = PH_LOAD;
	io->gen++;
	io->wait_c = NULL;
	io->nrecords = 0;
	map_clear(io);
	gettimeofday(&io->load_start, NULL);
	load_metadata(io);
}

void km_state_persist_load(km_state_persist *io)
{
	io->st->ready = false;
	io->st->ctr.ready = 0;
	start_load(io);
}

/* ---- write ---- */

static bool retriable(int16_t e)
{
	return e == K_ERR_NOT_LEADER || e == K_ERR_TIMED_OUT || e == K_ERR_LEADER_NOT_AVAILABLE ||
	       e == K_ERR_NOT_ENOUGH_REPLICAS || e == K_ERR_NOT_ENOUGH_REPLICAS_AFTER || e == K_ERR_UNKNOWN_TOPIC ||
	       e == K_ERR_COORD_LOADING || e == K_ERR_COORD_NOT_AVAILABLE || e == K_ERR_NOT_COORD ||
	       e == K_ERR_NOT_CONTROLLER || e == K_ERR_FENCED_LEADER_EPOCH || e == K_ERR_UNKNOWN_LEADER_EPOCH;
}

static void write_end(km_state_persist *io, km_err err, const char *msg)
{
	km_state_write_cb cb = io->wcb;
	km_state *st = io->st;

	free(io->rpart);
	free(io->pdone);
	free(io->pcount);
	io->rpart = NULL;
	io->pdone = NULL;
	io->pcount = NULL;
	io->wcb = NULL;
	io->ph = PH_IDLE;
	io->gen++;
	io->backoff_ms = 0;
	if (err != KM_OK) {
		/* Part of the write may have landed: read the topic back, under a new producer id. */
		io->pid = -1;
		km_state_persist_load(io);
	}
	cb(st, err, msg);
}

/* The failure is prefix followed by what. */
static void write_fail_or_retry(km_state_persist *io, bool retry, const char *prefix, const char *what)
{
	char msg[sizeof(io->wmsg)];
	snprintf(msg, sizeof(msg), "%s%s", prefix, what);
	memcpy(io->wmsg, msg, sizeof(msg));
	if (retry && ++io->attempts < WRITE_ATTEMPTS) {
		int ms = next_backoff(io);
		KM_INFO(COMP, 0, "writing %s: %s; retrying in %d ms", io->st->cfg.mirror_state_topic, io->wmsg, ms);
		io->gen++;
		/* Leaders may have moved: metadata again, then the same batches with the same sequence numbers. */
		after(io, ms, write_step);
		return;
	}
	write_end(io, KM_MIRROR_STATE_UNAVAILABLE, io->wmsg);
}

static void on_produce(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_produce_response r;
	km_arena a;
	km_rd rd;

	(void)c;
	if (!io)
		return;
	io->outstanding--;
	if (err != KM_OK) {
		drop_node(io, x.node_id);
		io->wretry = true;
		snprintf(io->wmsg, sizeof(io->wmsg), "broker %d: %s", x.node_id, km_err_name(err));
	} else {
		km_arena_init(&a, 0);
		km_rd_init(&rd, body, len);
		if (km_produce_response_decode(&rd, x.ver, &r, &a) != KM_OK) {
			io->wfail = true;
			snprintf(io->wmsg, sizeof(io->wmsg), "broker %d: undecodable Produce response", x.node_id);
		} else {
			for (int32_t i = 0; i < r.responses.count; i++)
				for (int32_t j = 0; j < r.responses.items[i].partition_responses.count; j++) {
					const km_produce_response_partition_produce_response *p =
						&r.responses.items[i].partition_responses.items[j];
					if (p->index < 0 || p->index >= io->nparts || io->pdone[p->index])
						continue;
					/* A duplicate is our own earlier attempt that landed. */
					if (p->error_code == 0 || p->error_code == K_ERR_DUPLICATE_SEQ) {
						io->pdone[p->index] = true;
						io->seq[p->index] += io->pcount[p->index];
						continue;
					}
					if (retriable(p->error_code))
						io->wretry = true;
					else
						io->wfail = true;
					snprintf(io->wmsg, sizeof(io->wmsg), "partition %d: %s%s%.*s", p->index,
						 km_err_name(p->error_code), p->error_message.len > 0 ? " (" : "",
						 p->error_message.len > 0 ? (int)p->error_message.len : 0,
						 p->error_message.p ? p->error_message.p : "");
					if (p->error_message.len > 0)
						strncat(io->wmsg, ")", sizeof(io->wmsg) - strlen(io->wmsg) - 1);
				}
		}
		km_arena_free(&a);
	}
	if (io->outstanding)
		return;
	for (int32_t p = 0; p < io->nparts; p++)
		if (!io->pdone[p]) {
			char tmp[512];
			snprintf(tmp, sizeof(tmp), "%s", io->wmsg[0] ? io->wmsg : "not acknowledged");
			write_fail_or_retry(io, !io->wfail, "", tmp);
			return;
		}
	write_end(io, KM_OK, NULL);
}

/* One Produce per leader, one batch per partition of that leader not yet acknowledged. */
static void write_produce(km_state_persist *io)
{
	int64_t now;
	struct timeval tv;
	bool sent_any = false;
	char why[200];

	/* Every leader written to must have negotiated its versions first. */
	for (int32_t p = 0; p < io->nparts; p++) {
		km_net_client *c;
		if (io->pdone[p])
			continue;
		c = leader_client(io, io->leaders[p]);
		if (!client_wait(io, c, write_produce))
			return;
		if (c && km_net_client_ready(c) && version_for(c, KM_API_PRODUCE, why, sizeof(why)) < 0) {
			write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
			return;
		}
	}
	gettimeofday(&tv, NULL);
	now = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
	io->wretry = io->wfail = false;
	io->wmsg[0] = 0;
	io->outstanding = 0;
	for (size_t ni = 0; ni < io->nnodes; ni++) {
		int32_t leader = io->nodes[ni].id;
		km_produce_request m;
		km_produce_request_topic_produce_data td;
		km_produce_request_partition_produce_data *pd = calloc((size_t)io->nparts, sizeof(*pd));
		km_wr *bw = calloc((size_t)io->nparts, sizeof(*bw));
		km_batch_record *br = calloc(io->nrecs ? io->nrecs : 1, sizeof(*br));
		int32_t npd = 0;
		km_err rc = KM_OK;
		km_wr w;

		if (!pd || !bw || !br) {
			free(pd);
			free(bw);
			free(br);
			write_end(io, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
			return;
		}
		for (int32_t p = 0; p < io->nparts && rc == KM_OK; p++) {
			size_t k = 0;
			km_batch_params bp;
			if (io->pdone[p] || io->leaders[p] != leader)
				continue;
			for (size_t i = 0; i < io->nrecs; i++)
				if (io->rpart[i] == p) {
					br[k].timestamp = now;
					br[k].offset_delta = (int32_t)k;
					br[k].key = (km_bytes){io->recs[i].key, (int32_t)io->recs[i].klen};
					br[k].value = io->recs[i].val ? (km_bytes){io->recs[i].val, (int32_t)io->recs[i].vlen}
								      : KM_BYTES_NULL;
					k++;
				}
			km_batch_params_init(&bp);
			bp.producer_id = io->pid;
			bp.producer_epoch = io->epoch;
			bp.base_sequence = io->seq[p];
			km_wr_init(&bw[npd]);
			rc = km_batch_build(&bp, br, k, &bw[npd]);
			km_produce_request_partition_produce_data_init(&pd[npd]);
			pd[npd].index = p;
			pd[npd].records = (km_bytes){bw[npd].buf, (int32_t)bw[npd].len};
			npd++;
		}
		if (rc == KM_OK && npd) {
			km_produce_request_init(&m);
			km_produce_request_topic_produce_data_init(&td);
			m.acks = -1;
			m.timeout_ms = 30000;
			td.name = km_str_c(io->st->cfg.mirror_state_topic);
			td.partition_data.items = pd;
			td.partition_data.count = npd;
			m.topic_data.items = &td;
			m.topic_data.count = 1;
			km_wr_init(&w);
			km_net_client *c = leader_client(io, leader);
			int16_t ver = c && km_net_client_ready(c) ? version_for(c, KM_API_PRODUCE, why, sizeof(why)) : 3;
			km_produce_request_encode(&w, ver, &m);
			rc = send_req(io, c, KM_API_PRODUCE, ver, &w, on_produce, leader, -1);
			km_wr_free(&w);
			if (rc == KM_OK) {
				io->outstanding++;
				sent_any = true;
			}
		}
		for (int32_t i = 0; i < npd; i++)
			km_wr_free(&bw[i]);
		free(pd);
		free(bw);
		free(br);
		if (rc != KM_OK) {
			drop_node(io, leader);
			if (!io->outstanding) {
				write_fail_or_retry(io, true, "sending Produce: ", km_err_name(rc));
				return;
			}
			/* The others are in flight: their answers end the round, and it is retried. */
			io->wretry = true;
			snprintf(io->wmsg, sizeof(io->wmsg), "sending Produce to broker %d: %s", leader, km_err_name(rc));
		}
	}
	if (!sent_any && !io->outstanding)
		write_fail_or_retry(io, true, "", "no leader for a partition of the state topic");
}

static void on_init_pid(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_init_producer_id_response r;
	km_arena a;
	km_rd rd;

	(void)c;
	if (!io)
		return;
	if (err != KM_OK) {
		drop_boot(io);
		write_fail_or_retry(io, true, "InitProducerId: ", km_err_name(err));
		return;
	}
	km_arena_init(&a, 1 << 20);
	km_rd_init(&rd, body, len);
	if (km_init_producer_id_response_decode(&rd, x.ver, &r, &a) != KM_OK) {
		km_arena_free(&a);
		write_fail_or_retry(io, false, "InitProducerId: ", "undecodable response");
		return;
	}
	km_arena_free(&a);
	if (r.error_code) {
		write_fail_or_retry(io, retriable(r.error_code), "InitProducerId: ", km_err_name(r.error_code));
		return;
	}
	io->pid = r.producer_id;
	io->epoch = r.producer_epoch;
	KM_INFO(COMP, 0, "writing %s as producer id %lld (InitProducerId v%d, Metadata v%d)",
		io->st->cfg.mirror_state_topic, (long long)r.producer_id, x.ver, io->used[0]);
	memset(io->seq, 0, (size_t)io->nparts * sizeof(*io->seq));
	KM_DEBUG(COMP, 0, "state producer id %lld epoch %d", (long long)io->pid, io->epoch);
	write_produce(io);
}

static void init_pid(km_state_persist *io)
{
	km_init_producer_id_request m;
	km_wr w;
	km_err rc;
	km_net_client *c = boot(io);
	int16_t ver = 0;
	char why[200];

	if (!client_wait(io, c, init_pid))
		return;
	if (c && km_net_client_ready(c) && (ver = version_for(c, KM_API_INIT_PRODUCER_ID, why, sizeof(why))) < 0) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
		return;
	}
	km_init_producer_id_request_init(&m);
	m.transactional_id = KM_STR_NULL;
	m.transaction_timeout_ms = 60000;
	m.producer_id = -1;
	m.producer_epoch = -1;
	km_wr_init(&w);
	km_init_producer_id_request_encode(&w, ver, &m);
	rc = send_req(io, c, KM_API_INIT_PRODUCER_ID, ver, &w, on_init_pid, -1, -1);
	km_wr_free(&w);
	if (rc != KM_OK) {
		drop_boot(io);
		write_fail_or_retry(io, true, "InitProducerId: ", km_err_name(rc));
	}
}

/* The records' partitions, once the layout is known. */
static bool write_layout(km_state_persist *io)
{
	free(io->pdone);
	free(io->pcount);
	free(io->rpart);
	io->pdone = calloc((size_t)io->nparts, sizeof(*io->pdone));
	io->pcount = calloc((size_t)io->nparts, sizeof(*io->pcount));
	io->rpart = calloc(io->nrecs, sizeof(*io->rpart));
	if (!io->pdone || !io->pcount || !io->rpart)
		return false;
	io->layout_parts = io->nparts;
	for (int32_t p = 0; p < io->nparts; p++)
		io->pdone[p] = true;
	for (size_t i = 0; i < io->nrecs; i++) {
		int32_t p = km_state_key_partition(io->recs[i].key, io->recs[i].klen, io->nparts);
		io->rpart[i] = p;
		io->pdone[p] = false;
		io->pcount[p]++;
	}
	return true;
}

static void on_write_metadata(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg);

static void on_create_topics(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_create_topics_response r;
	km_arena a;
	km_rd rd;
	char why[400];

	(void)c;
	if (!io)
		return;
	if (err != KM_OK) {
		drop_boot(io);
		write_fail_or_retry(io, true, "CreateTopics: ", km_err_name(err));
		return;
	}
	km_arena_init(&a, 1 << 20);
	km_rd_init(&rd, body, len);
	if (km_create_topics_response_decode(&rd, x.ver, &r, &a) != KM_OK || r.topics.count != 1) {
		km_arena_free(&a);
		write_fail_or_retry(io, false, "CreateTopics: ", "undecodable response");
		return;
	}
	const km_create_topics_response_creatable_topic_result *t = &r.topics.items[0];
	if (t->error_code && t->error_code != K_ERR_TOPIC_EXISTS) {
		snprintf(why, sizeof(why), "creating %s: %s%s%.*s%s", io->st->cfg.mirror_state_topic,
			 km_err_name(t->error_code), t->error_message.len > 0 ? " (" : "",
			 t->error_message.len > 0 ? (int)t->error_message.len : 0, t->error_message.p ? t->error_message.p : "",
			 t->error_message.len > 0 ? ")" : "");
		km_arena_free(&a);
		write_fail_or_retry(io, retriable(t->error_code), "", why);
		return;
	}
	KM_INFO(COMP, 0, "%s %s", io->st->cfg.mirror_state_topic,
		t->error_code ? "was created by another kmirrord" : "created");
	km_arena_free(&a);
	write_step(io); /* metadata until leaders are known */
}

static void create_topic(km_state_persist *io)
{
	const km_config *cfg = &io->st->cfg;
	km_create_topics_request m;
	km_create_topics_request_creatable_topic t;
	km_create_topics_request_creatable_topic_config cf[2];
	int64_t rf = cfg->mirror_state_replication_factor;
	char misr[8];
	km_wr w;
	km_err rc;
	km_net_client *c = boot(io);
	int16_t ver = 0;
	char why[200];

	if (!client_wait(io, c, create_topic))
		return;
	if (c && km_net_client_ready(c) && (ver = version_for(c, KM_API_CREATE_TOPICS, why, sizeof(why))) < 0) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
		return;
	}
	if (rf < 0)
		rf = io->nbrokers >= 3 ? 3 : io->nbrokers > 0 ? io->nbrokers : 1;
	snprintf(misr, sizeof(misr), "%d", rf >= 3 ? 2 : 1);
	km_create_topics_request_init(&m);
	km_create_topics_request_creatable_topic_init(&t);
	km_create_topics_request_creatable_topic_config_init(&cf[0]);
	km_create_topics_request_creatable_topic_config_init(&cf[1]);
	cf[0].name = km_str_c("cleanup.policy");
	cf[0].value = km_str_c("compact");
	cf[1].name = km_str_c("min.insync.replicas");
	cf[1].value = km_str_c(misr);
	t.name = km_str_c(cfg->mirror_state_topic);
	t.num_partitions = (int32_t)cfg->mirror_state_partitions;
	t.replication_factor = (int16_t)rf;
	t.configs.items = cf;
	t.configs.count = 2;
	m.topics.items = &t;
	m.topics.count = 1;
	m.timeout_ms = 30000;
	km_wr_init(&w);
	km_create_topics_request_encode(&w, ver, &m);
	KM_INFO(COMP, 0, "creating %s: %d partitions, replication factor %d, min.insync.replicas %s",
		cfg->mirror_state_topic, t.num_partitions, (int)rf, misr);
	rc = send_req(io, c, KM_API_CREATE_TOPICS, ver, &w, on_create_topics, -1, -1);
	km_wr_free(&w);
	if (rc != KM_OK) {
		drop_boot(io);
		write_fail_or_retry(io, true, "CreateTopics: ", km_err_name(rc));
	}
}

static void on_write_metadata(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_metadata_response r;
	km_arena a;
	km_rd rd;
	int16_t terr = 0;
	km_err rc;

	(void)c;
	if (!io)
		return;
	if (err != KM_OK) {
		drop_boot(io);
		write_fail_or_retry(io, true, "Metadata: ", km_err_name(err));
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	rc = km_metadata_response_decode(&rd, x.ver, &r, &a);
	if (rc == KM_OK)
		rc = take_metadata(io, &r, &terr);
	km_arena_free(&a);
	if (rc == KM_OK && !io->exists && terr == K_ERR_UNKNOWN_TOPIC) {
		create_topic(io);
		return;
	}
	if (rc != KM_OK || !io->exists) {
		/* Leaders of a topic just created take a moment: these retries do not count as failed attempts. */
		if (io->attempts < META_ATTEMPTS) {
			io->attempts++;
			io->gen++;
			after(io, 250, write_step);
			return;
		}
		write_fail_or_retry(io, false, "", rc == KM_ERR_UNSUPPORTED ? "a partition of the state topic has no leader"
									 : km_err_name(rc != KM_OK ? rc : terr));
		return;
	}
	/* A retry keeps what was acknowledged (unless the layout changed under it). */
	if ((!io->pdone || io->layout_parts != io->nparts) && !write_layout(io)) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
		return;
	}
	if (io->pid < 0)
		init_pid(io);
	else
		write_produce(io);
}

/* Metadata (creating the topic when absent), the producer id, then the Produce round. */
static void write_step(km_state_persist *io)
{
	km_wr w;
	km_err rc;
	char *name = io->st->cfg.mirror_state_topic;
	km_net_client *c;
	int16_t ver = 0;
	char why[200];

	if (io->exists && io->pid >= 0 && io->pdone && io->attempts == 0) {
		write_produce(io);
		return;
	}
	c = boot(io);
	if (!client_wait(io, c, write_step))
		return;
	if (c && km_net_client_ready(c) && (ver = version_for(c, KM_API_METADATA, why, sizeof(why))) < 0) {
		write_end(io, KM_MIRROR_STATE_UNAVAILABLE, why);
		return;
	}
	encode_metadata(&w, ver, &name, 1);
	rc = send_req(io, c, KM_API_METADATA, ver, &w, on_write_metadata, -1, -1);
	km_wr_free(&w);
	if (rc != KM_OK) {
		drop_boot(io);
		write_fail_or_retry(io, true, "Metadata: ", km_err_name(rc));
	}
}

void km_state_persist_write(km_state_persist *io, const km_state_rec *recs, size_t n, km_state_write_cb cb)
{
	io->ph = PH_WRITE;
	io->wait_c = NULL;
	io->recs = recs;
	io->nrecs = n;
	io->wcb = cb;
	io->attempts = 0;
	io->backoff_ms = 0;
	io->gen++;
	free(io->pdone);
	io->pdone = NULL;
	if (io->exists && io->nparts > 0 && io->pid >= 0 && write_layout(io)) {
		write_produce(io);
		return;
	}
	write_step(io);
}

/* ---- destination topics' metadata (start) ---- */

static void meta_end(km_state_persist *io, km_err err, const char *msg, const km_state_topic_meta *metas)
{
	km_state_meta_cb cb = io->mcb;
	for (size_t i = 0; i < io->mn; i++)
		free(io->mnames[i]);
	free(io->mnames);
	io->mnames = NULL;
	io->mn = 0;
	io->mcb = NULL;
	io->ph = PH_IDLE;
	io->gen++;
	cb(io->st, err, msg, metas);
}

static void meta_send(km_state_persist *io);

static void on_topics_metadata(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx x;
	km_state_persist *io = ctx_take(arg, &x);
	km_metadata_response r;
	km_arena a;
	km_rd rd;
	km_state_topic_meta *metas;
	char why[200];

	(void)c;
	if (!io)
		return;
	if (err != KM_OK) {
		drop_boot(io);
		if (++io->attempts < WRITE_ATTEMPTS) {
			io->gen++;
			after(io, next_backoff(io), meta_send);
			return;
		}
		snprintf(why, sizeof(why), "the destination's metadata could not be read: %s", km_err_name(err));
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, why, NULL);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	metas = calloc(io->mn ? io->mn : 1, sizeof(*metas));
	if (!metas || km_metadata_response_decode(&rd, x.ver, &r, &a) != KM_OK) {
		km_arena_free(&a);
		free(metas);
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, "undecodable Metadata response", NULL);
		return;
	}
	for (size_t i = 0; i < io->mn; i++) {
		metas[i].error = K_ERR_UNKNOWN_TOPIC;
		for (int32_t j = 0; j < r.topics.count; j++) {
			const km_metadata_response_topic *t = &r.topics.items[j];
			if (!km_str_eq_c(t->name, io->mnames[i]))
				continue;
			metas[i].error = t->error_code;
			metas[i].id = t->topic_id;
			metas[i].partitions = t->partitions.count > 0 ? t->partitions.count : 0;
		}
	}
	km_arena_free(&a);
	meta_end(io, KM_OK, NULL, metas);
	free(metas);
}

static void meta_send(km_state_persist *io)
{
	km_wr w;
	km_err rc;
	km_net_client *c = boot(io);
	int16_t ver = 0;
	char why[200];

	if (!client_wait(io, c, meta_send))
		return;
	if (c && km_net_client_ready(c) && (ver = version_for(c, KM_API_METADATA, why, sizeof(why))) < 0) {
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, why, NULL);
		return;
	}
	encode_metadata(&w, ver, io->mnames, io->mn);
	rc = send_req(io, c, KM_API_METADATA, ver, &w, on_topics_metadata, -1, -1);
	km_wr_free(&w);
	if (rc != KM_OK) {
		drop_boot(io);
		if (++io->attempts < WRITE_ATTEMPTS) {
			io->gen++;
			after(io, next_backoff(io), meta_send);
			return;
		}
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, "the destination's metadata could not be asked", NULL);
	}
}

void km_state_persist_topics(km_state_persist *io, char *const *names, size_t n, km_state_meta_cb cb)
{
	io->ph = PH_META;
	io->wait_c = NULL;
	io->mcb = cb;
	io->attempts = 0;
	io->backoff_ms = 0;
	io->gen++;
	io->mnames = calloc(n ? n : 1, sizeof(*io->mnames));
	for (size_t i = 0; io->mnames && i < n; i++)
		if ((io->mnames[i] = strdup(names[i])))
			io->mn++;
	if (!io->mnames || io->mn != n) {
		meta_end(io, KM_MIRROR_STATE_UNAVAILABLE, "out of memory", NULL);
		return;
	}
	meta_send(io);
}

/* ---- life ---- */

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
	io->timer = evtimer_new(st->base, on_timer, io);
	if (!io->timer) {
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
	if (io->boot)
		km_net_client_free(io->boot);
	for (size_t i = 0; i < io->nnodes; i++)
		if (io->nodes[i].c)
			km_net_client_free(io->nodes[i].c);
	free(io->nodes);
	map_clear(io);
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
