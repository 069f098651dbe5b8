/*
 * Which kmirrord syncs which mirror: members of the destination's consumer group __kmirror-sync
 * (KIP-848), subscribed to the state topic; a mirror belongs to the owner of its partition (docs/mirror.md,
 * "One kmirrord per mirror").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <openssl/rand.h>

#include "kmirror/arena.h"
#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/consumer_group_heartbeat_request.h"
#include "kmirror/msg/consumer_group_heartbeat_response.h"
#include "kmirror/msg/find_coordinator_request.h"
#include "kmirror/msg/find_coordinator_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/rpc.h"
#include "mirror_int.h"

#define COMP KM_MIRROR_COMP

/* Kafka's codes the lease reacts to. */
enum {
	K_COORDINATOR_LOAD_IN_PROGRESS = 14, K_COORDINATOR_NOT_AVAILABLE = 15, K_NOT_COORDINATOR = 16,
	K_UNKNOWN_MEMBER_ID = 25, K_UNSUPPORTED_VERSION = 35, K_FENCED_MEMBER_EPOCH = 110,
	K_UNSUPPORTED_ASSIGNOR = 112,
};
/* Ownership is given up when no heartbeat succeeded for this long (the broker's default session timeout). */
#define SESSION_MS 45000
#define REBALANCE_TIMEOUT_MS 30000
#define RETRY_MS 1000
#define MAX_OWNED 100000

typedef enum { L_META, L_FIND, L_BEAT, L_ALONE } lphase;

struct km_lease {
	km_mirror *mi;
	km_cluster *dst;
	struct event *ev;
	lphase ph;
	bool inflight, freeing;
	int16_t ver;      /* of the request in flight (its answer is decoded with it) */
	char member[40];
	int32_t epoch;
	int32_t coord;
	km_uuid topic_id;
	int32_t nparts;   /* the state topic's partitions; 0: not known (it may not exist yet) */
	bool *owned;      /* nparts entries */
	int64_t last_ok;  /* the last heartbeat answered without error */
	bool owned_any;   /* for the log line when ownership changes */
};

static int64_t now_ms(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void later(km_lease *l, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	if (!l->freeing)
		event_add(l->ev, &tv);
}

static void disown(km_lease *l, const char *why)
{
	bool had = false;
	for (int32_t i = 0; i < l->nparts; i++) {
		had |= l->owned[i];
		l->owned[i] = false;
	}
	if (had)
		KM_WARN(COMP, 0, "metadata sync: this kmirrord gives up its mirrors (%s); another one takes them over", why);
}

static void rejoin(km_lease *l)
{
	l->epoch = 0;
	disown(l, "fenced from the group __kmirror-sync");
}

static void on_response(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg);

static void send_req(km_lease *l, km_net_client *c, int16_t key, km_wr *w, int16_t ver)
{
	if (km_cluster_send(c, key, ver, w, on_response, l) == KM_OK) {
		l->inflight = true;
		l->ver = ver;
		return;
	}
	km_cluster_drop(l->dst, c);
	later(l, RETRY_MS);
}

/* A usable client for the phase and the request's version (-1: not usable now, or not supported). */
static km_net_client *client(km_lease *l, int32_t node, int16_t key, int16_t lo, int16_t hi, int16_t *ver)
{
	km_net_client *c = node < 0 ? km_cluster_any(l->dst) : km_cluster_node(l->dst, node);

	if (!km_cluster_usable(l->dst, c)) {
		later(l, RETRY_MS);
		return NULL;
	}
	*ver = km_net_version_pick(c, key, lo, hi);
	return c;
}

static void alone(km_lease *l, const char *why)
{
	if (l->ph != L_ALONE)
		KM_WARN(COMP, 0, "metadata sync: %s; this kmirrord syncs every mirror (with several kmirrords in front of "
			"this destination, each does: the work is repeated, never conflicting)", why);
	l->ph = L_ALONE;
}

static void step(km_lease *l)
{
	km_net_client *c;
	int16_t ver;
	km_wr w;
	const char *topic = km_state_topic_name_of_store(km_mirror_store(l->mi));

	if (l->freeing || l->inflight || l->ph == L_ALONE || !l->dst)
		return;
	/* Whatever it is doing (looking for the coordinator again too): no heartbeat for that long, no mirror. */
	if (l->last_ok && now_ms() - l->last_ok > SESSION_MS) {
		disown(l, "no heartbeat answered for the session timeout");
		l->epoch = 0;
		l->last_ok = 0;
	}
	km_wr_init(&w);
	switch (l->ph) {
	case L_META: {
		km_metadata_request m;
		km_metadata_request_topic t;
		if (!(c = client(l, -1, KM_API_METADATA, 10, 12, &ver)))
			return;
		if (ver < 0)
			return alone(l, "the destination does not give topic ids in Metadata (before Kafka 2.8)");
		km_metadata_request_init(&m);
		km_metadata_request_topic_init(&t);
		t.name = km_str_c(topic);
		m.topics.items = &t;
		m.topics.count = 1;
		m.allow_auto_topic_creation = false;
		km_metadata_request_encode(&w, ver, &m);
		return send_req(l, c, KM_API_METADATA, &w, ver);
	}
	case L_FIND: {
		km_find_coordinator_request m;
		km_str key = km_str_c(KM_SYNC_GROUP);
		if (!(c = client(l, -1, KM_API_FIND_COORDINATOR, 4, 6, &ver)))
			return;
		if (ver < 0 || km_net_client_version(c, KM_API_CONSUMER_GROUP_HEARTBEAT) < 1)
			return alone(l, "the destination has no consumer group protocol (KIP-848, Kafka 4.0)");
		km_find_coordinator_request_init(&m);
		m.key_type = 0;
		m.coordinator_keys.items = &key;
		m.coordinator_keys.count = 1;
		km_find_coordinator_request_encode(&w, ver, &m);
		return send_req(l, c, KM_API_FIND_COORDINATOR, &w, ver);
	}
	case L_BEAT: {
		km_consumer_group_heartbeat_request m;
		km_consumer_group_heartbeat_request_topic_partitions tp;
		km_str sub = km_str_c(topic);
		int32_t *parts = calloc((size_t)(l->nparts > 0 ? l->nparts : 1), sizeof(*parts)), n = 0;
		if (!parts)
			return later(l, RETRY_MS);
		if (!(c = client(l, l->coord, KM_API_CONSUMER_GROUP_HEARTBEAT, 1, 1, &ver))) {
			free(parts);
			return;
		}
		if (ver < 0) {
			free(parts);
			return alone(l, "the destination has no consumer group protocol (KIP-848, Kafka 4.0)");
		}
		for (int32_t i = 0; i < l->nparts; i++)
			if (l->owned[i])
				parts[n++] = i;
		km_consumer_group_heartbeat_request_init(&m);
		km_consumer_group_heartbeat_request_topic_partitions_init(&tp);
		m.group_id = km_str_c(KM_SYNC_GROUP);
		m.member_id = km_str_c(l->member);
		m.member_epoch = l->epoch;
		m.instance_id = KM_STR_NULL;
		m.rack_id = KM_STR_NULL;
		m.rebalance_timeout_ms = REBALANCE_TIMEOUT_MS;
		m.subscribed_topic_names.items = &sub;
		m.subscribed_topic_names.count = 1;
		m.subscribed_topic_regex = KM_STR_NULL;
		m.server_assignor = KM_STR_NULL;
		/* What it owns now: the broker gives a revoked partition to another member only once it is left out here. */
		tp.topic_id = l->topic_id;
		tp.partitions.items = parts;
		tp.partitions.count = n;
		m.topic_partitions.items = &tp;
		m.topic_partitions.count = n ? 1 : 0;
		km_consumer_group_heartbeat_request_encode(&w, ver, &m);
		free(parts);
		return send_req(l, c, KM_API_CONSUMER_GROUP_HEARTBEAT, &w, ver);
	}
	case L_ALONE:
		break;
	}
	km_wr_free(&w);
}

static void took_meta(km_lease *l, const km_metadata_response *r)
{
	const km_metadata_response_topic *t = r->topics.count == 1 ? &r->topics.items[0] : NULL;
	bool *owned;

	if (km_cluster_brokers(l->dst, r) != KM_OK || !t)
		return later(l, RETRY_MS);
	if (t->error_code) {
		/* No state topic yet (no mirror created): nothing to own; look again later. */
		l->nparts = 0;
		return later(l, 5000);
	}
	if (t->partitions.count <= 0 || t->partitions.count > MAX_OWNED ||
	    !(owned = calloc((size_t)t->partitions.count, sizeof(*owned))))
		return later(l, RETRY_MS);
	free(l->owned);
	l->owned = owned;
	l->nparts = t->partitions.count;
	l->topic_id = t->topic_id;
	l->ph = L_FIND;
	later(l, 0);
}

static void took_find(km_lease *l, const km_find_coordinator_response *r)
{
	const km_find_coordinator_response_coordinator *c = r->coordinators.count == 1 ? &r->coordinators.items[0] : NULL;

	if (!c || c->error_code) {
		KM_DEBUG(COMP, 0, "metadata sync: FindCoordinator of group %s: %s", KM_SYNC_GROUP,
			 km_err_name(c ? c->error_code : -1));
		return later(l, RETRY_MS);
	}
	l->coord = c->node_id;
	l->ph = L_BEAT;
	later(l, 0);
}

static void took_beat(km_lease *l, const km_consumer_group_heartbeat_response *r)
{
	switch (r->error_code) {
	case 0:
		break;
	case K_UNKNOWN_MEMBER_ID:
	case K_FENCED_MEMBER_EPOCH:
		rejoin(l);
		return later(l, 0);
	case K_NOT_COORDINATOR:
	case K_COORDINATOR_NOT_AVAILABLE:
	case K_COORDINATOR_LOAD_IN_PROGRESS:
		l->ph = L_FIND;
		return later(l, RETRY_MS);
	case K_UNSUPPORTED_VERSION:
	case K_UNSUPPORTED_ASSIGNOR:
		return alone(l, "the destination refuses the consumer group protocol (group.coordinator.rebalance.protocols)");
	default:
		KM_WARN(COMP, 0, "metadata sync: heartbeat in group %s: %s%s%.*s", KM_SYNC_GROUP, km_err_name(r->error_code),
			r->error_message.len > 0 ? ": " : "", r->error_message.len > 0 ? (int)r->error_message.len : 0,
			r->error_message.p);
		/* A state topic recreated, a changed partition count: start over. */
		l->ph = L_META;
		l->epoch = 0;
		disown(l, km_err_name(r->error_code));
		return later(l, RETRY_MS);
	}
	l->last_ok = now_ms();
	l->epoch = r->member_epoch;
	if (r->assignment) {
		bool any = false;
		for (int32_t i = 0; i < l->nparts; i++)
			l->owned[i] = false;
		for (int32_t i = 0; i < r->assignment->topic_partitions.count; i++) {
			const km_consumer_group_heartbeat_response_topic_partitions *tp = &r->assignment->topic_partitions.items[i];
			if (memcmp(tp->topic_id.b, l->topic_id.b, sizeof(l->topic_id.b)))
				continue;
			for (int32_t j = 0; j < tp->partitions.count; j++)
				if (tp->partitions.items[j] >= 0 && tp->partitions.items[j] < l->nparts)
					any = l->owned[tp->partitions.items[j]] = true;
		}
		if (any != l->owned_any)
			KM_INFO(COMP, 0, "metadata sync: this kmirrord %s (group %s, epoch %d)",
				any ? "syncs the mirrors of its state topic partitions" : "owns no mirror's sync now",
				KM_SYNC_GROUP, (int)l->epoch);
		l->owned_any = any;
	}
	later(l, r->heartbeat_interval_ms > 0 ? r->heartbeat_interval_ms : 5000);
}

static void on_response(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	km_lease *l = arg;
	km_arena a;
	km_rd rd;
	km_err rc = KM_ERR_DECODE;

	if (l->freeing)
		return;
	l->inflight = false;
	if (err != KM_OK) {
		km_cluster_drop(l->dst, c);
		if (l->ph == L_BEAT)
			l->ph = L_FIND;
		return later(l, RETRY_MS);
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	switch (l->ph) {
	case L_META: {
		km_metadata_response r;
		if ((rc = km_metadata_response_decode(&rd, l->ver, &r, &a)) == KM_OK)
			took_meta(l, &r);
		break;
	}
	case L_FIND: {
		km_find_coordinator_response r;
		if ((rc = km_find_coordinator_response_decode(&rd, l->ver, &r, &a)) == KM_OK)
			took_find(l, &r);
		break;
	}
	case L_BEAT: {
		km_consumer_group_heartbeat_response r;
		if ((rc = km_consumer_group_heartbeat_response_decode(&rd, l->ver, &r, &a)) == KM_OK)
			took_beat(l, &r);
		break;
	}
	case L_ALONE:
		rc = KM_OK;
		break;
	}
	km_arena_free(&a);
	if (rc != KM_OK)
		later(l, RETRY_MS);
}

static void on_ev(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	step(arg);
}

static void on_cluster(void *arg)
{
	km_lease *l = arg;
	if (!l->inflight)
		later(l, 0);
}

km_lease *km_lease_new(km_mirror *mi)
{
	km_lease *l = calloc(1, sizeof(*l));
	uint8_t rnd[16];

	if (!l)
		return NULL;
	l->mi = mi;
	l->coord = -1;
	if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
		free(l);
		return NULL;
	}
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(l->member + 2 * i, 3, "%02x", rnd[i]);
	if (!(l->ev = event_new(km_mirror_base(mi), -1, 0, on_ev, l))) {
		free(l);
		return NULL;
	}
	return l;
}

void km_lease_start(km_lease *l)
{
	if (!l || l->dst || l->ph == L_ALONE)
		return;
	if (!(l->dst = km_mirror_dest_cluster(l->mi, KM_SYNC_GROUP, "lease", on_cluster, l)))
		return alone(l, "no client for the destination");
	later(l, 0);
}

static void ignore_answer(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	(void)c, (void)err, (void)body, (void)len, (void)arg;
}

/* Leave the group, so that another kmirrord takes the mirrors at once rather than after the session timeout. */
static void leave(km_lease *l)
{
	km_net_client *c = l->coord >= 0 ? km_cluster_node(l->dst, l->coord) : NULL;
	km_consumer_group_heartbeat_request m;
	km_wr w;

	if (l->ph != L_BEAT || l->epoch <= 0 || !km_cluster_usable(l->dst, c) ||
	    km_net_client_version(c, KM_API_CONSUMER_GROUP_HEARTBEAT) < 1)
		return;
	km_consumer_group_heartbeat_request_init(&m);
	m.group_id = km_str_c(KM_SYNC_GROUP);
	m.member_id = km_str_c(l->member);
	m.member_epoch = -1;
	m.instance_id = KM_STR_NULL;
	m.rack_id = KM_STR_NULL;
	m.rebalance_timeout_ms = -1;
	m.subscribed_topic_names.count = -1;
	m.subscribed_topic_regex = KM_STR_NULL;
	m.server_assignor = KM_STR_NULL;
	m.topic_partitions.count = -1;
	km_wr_init(&w);
	km_consumer_group_heartbeat_request_encode(&w, 1, &m);
	if (km_cluster_send(c, KM_API_CONSUMER_GROUP_HEARTBEAT, 1, &w, ignore_answer, NULL) != KM_OK)
		return;
	KM_INFO(COMP, 0, "metadata sync: left the group %s", KM_SYNC_GROUP);
}

void km_lease_free(km_lease *l)
{
	if (!l)
		return;
	l->freeing = true;
	if (l->dst)
		leave(l);
	km_cluster_free(l->dst);
	if (l->ev)
		event_free(l->ev);
	free(l->owned);
	free(l);
}

bool km_lease_owns(const km_lease *l, const char *mirror)
{
	uint64_t h;

	if (!l || l->ph == L_ALONE)
		return true;
	if (l->nparts <= 0 || !l->owned)
		return false;
	h = km_fnv1a(KM_FNV1A_INIT, mirror, strlen(mirror));
	return l->owned[h % (uint64_t)l->nparts];
}

