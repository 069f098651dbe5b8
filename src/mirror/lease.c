/*
 * Which kmirrord runs which mirror (its metadata sync, and its pipelines with mirror_pipelines =
 * owned): members of the destination's consumer group mirror_sync_group (KIP-848), subscribed to the
 * state topic; a mirror belongs to the owner of its partition (docs/mirror.md, "One kmirrord per
 * mirror"). A group that cannot be joined for long is left for its next generation, recorded in
 * the state topic for every kmirrord to follow ("The sync group moves").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <openssl/rand.h>

#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/consumer_group_describe_request.h"
#include "kmirror/msg/consumer_group_describe_response.h"
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
	K_UNKNOWN_MEMBER_ID = 25, K_UNSUPPORTED_VERSION = 35, K_GROUP_ID_NOT_FOUND = 69, K_FENCED_MEMBER_EPOCH = 110,
	K_UNSUPPORTED_ASSIGNOR = 112,
};
/* Ownership is given up when no heartbeat succeeded for this long (the broker's default session timeout). */
#define SESSION_MS 45000
#define REBALANCE_TIMEOUT_MS 30000
#define RETRY_MS 1000
#define MAX_OWNED 100000
/* How often a revoked partition still being let go of is looked at (its release goes out with the next heartbeat). */
#define HELD_POLL_MS 100
/* How soon a member with nothing assigned heartbeats again (the interval is 5 s: a start would wait that long). */
#define JOIN_POLL_MS 500
/* How often the group is described (who owns which state partition: describe's Owner). */
#define DESCRIBE_MS 10000
/* A group not joined for this long is reported (a warning, then one a minute while it lasts). */
#define FAIL_WARN_MS 15000
#define FAIL_REPEAT_MS 60000
/* How often the state is looked at for the group to join (another kmirrord may have moved it). */
#define WATCH_MS 500
/* Its partition count is read with the state topic's metadata: a move picks a group on another partition. */
#define OFFSETS_TOPIC "__consumer_offsets"

typedef enum { L_META, L_FIND, L_BEAT, L_DESCRIBE, L_ALONE } lphase;

struct km_lease {
	km_mirror *mi;
	km_cluster *dst;
	struct event *ev, *watch_ev;
	char base[256];     /* mirror_sync_group (copied: a reload frees the configuration's strings) */
	char group[1100];   /* the group joined: base or its generation (the state's sync group record) */
	int32_t gen;
	uint32_t group_seq; /* bumped when the group changes: answers about the earlier one are dropped */
	uint32_t req_seq;   /* group_seq when the request in flight was sent */
	int64_t move_after_ms; /* 0: never moves on its own */
	int64_t fail_since; /* the first failure since the last heartbeat answered without error; 0: none */
	int64_t err_since;  /* the first answer since then saying the group cannot be had (the coordinator's) */
	int64_t err_at;     /* the last such answer */
	int16_t fail_code;  /* that error */
	int64_t warned_at;
	struct move_token *moving; /* the move's record is being written (its answer's handle) */
	int32_t offsets_parts; /* partitions of __consumer_offsets; 0: not known */
	km_metric_series *m_joined, *m_gen, *m_moves;
	lphase ph;
	bool inflight, freeing;
	char member[40];
	int32_t epoch;
	int32_t coord;
	km_uuid topic_id;
	int32_t nparts;   /* the state topic's partitions; 0: not known (it may not exist yet) */
	bool *owned;      /* nparts entries */
	bool *held;       /* revoked, still being let go of (reported as owned until released) */
	int64_t last_ok;  /* when the last heartbeat answered without error was sent */
	int64_t sent_at;  /* when the request in flight was sent */
	int32_t hb_ms;    /* the heartbeat interval the coordinator asks for */
	bool owned_any;   /* for the log line when ownership changes */
	bool adopted;     /* an earlier life's membership was looked up (once per join) */
	bool adopting;    /* the group is being described to take that membership's epoch */
	char **owner_of;  /* nparts entries: who owns each state partition (<host>@<HTTP listener>), NULL: not known */
	int64_t described_at; /* the group's last ConsumerGroupDescribe answer */
	int beat_in;      /* when the next heartbeat is due after a describe (ms) */
	void (*changed)(void *arg); /* the owned set moved (km_lease_on_change) */
	bool (*busy)(void *arg, int32_t slot);
	void *changed_arg;
};

static void later(km_lease *l, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	if (!l->freeing)
		event_add(l->ev, &tv);
}

/*
 * An owner whose last heartbeat answered was sent longer ago than one and a half intervals does
 * not act on its mirrors until the next answer: the group may have given them to another kmirrord
 * (a member is expired after its session timeout, which is longer than the interval), and a
 * process paused past it (SIGSTOP, a stalled host) must not write on waking before it heard so.
 */
static bool stale(const km_lease *l, int64_t now)
{
	/*
	 * In every phase: a heartbeat that failed outright (a coordinator restarting, a refused
	 * connection) sends the lease to look for the coordinator, and the time since the last
	 * answer runs on there too (docs/reliability.md, finding 36).
	 */
	return l->ph != L_ALONE && l->last_ok && now - l->last_ok > (int64_t)l->hb_ms * 3 / 2;
}

static void notify(km_lease *l)
{
	if (l->changed && !l->freeing)
		l->changed(l->changed_arg);
}

static void disown(km_lease *l, const char *why)
{
	bool had = false;
	for (int32_t i = 0; i < l->nparts; i++) {
		had |= l->owned[i];
		l->owned[i] = l->held[i] = false;
	}
	if (had) {
		KM_WARN(COMP, 0, "mirrors: this kmirrord gives up its mirrors (%s); another one takes them over", why);
		l->owned_any = false;
		notify(l);
	}
}

static void rejoin(km_lease *l)
{
	char why[1200];
	l->epoch = 0;
	snprintf(why, sizeof(why), "fenced from the group %s", l->group);
	disown(l, why);
}

/* A member whose heartbeats are answered (or alone: a destination without the protocol, every mirror run here). */
static bool joined(const km_lease *l, int64_t now)
{
	return l->ph == L_ALONE ||
	       ((l->ph == L_BEAT || l->ph == L_DESCRIBE) && l->last_ok && !l->fail_since && !stale(l, now));
}

static void report(km_lease *l)
{
	if (l->m_joined)
		km_metric_set(l->m_joined, joined(l, km_wall_ms()) ? 1 : 0);
	if (l->m_gen)
		km_metric_set(l->m_gen, l->gen);
}

/*
 * A request about the group failed: code is the broker's error, 0 when nothing was answered (a
 * connection lost, a timeout). Only the coordinator's answers that the group cannot be had count
 * toward a move: not being able to reach the destination, or an authorization error, would be
 * the same in every group.
 */
static void failing(km_lease *l, int16_t code)
{
	int64_t now = km_wall_ms();
	if (!l->fail_since)
		l->fail_since = now;
	if (code)
		l->fail_code = code;
	if (code == K_COORDINATOR_LOAD_IN_PROGRESS || code == K_COORDINATOR_NOT_AVAILABLE || code == K_NOT_COORDINATOR ||
	    code == K_GROUP_ID_NOT_FOUND) {
		if (!l->err_since)
			l->err_since = now;
		l->err_at = now;
	}
	report(l);
}

static void recovered(km_lease *l)
{
	if (l->fail_since && l->warned_at)
		KM_INFO(COMP, 0, "mirrors: this kmirrord is a member of its sync group %s again, after %lld s",
			l->group, (long long)((km_wall_ms() - l->fail_since) / 1000));
	l->fail_since = 0;
	l->err_since = 0;
	l->fail_code = 0;
	l->warned_at = 0;
	report(l);
}

/* Kafka's partition of __consumer_offsets for a group (abs(String.hashCode) mod partitions); -1: not known. */
static int32_t offsets_partition(const km_lease *l, const char *group)
{
	int32_t h = 0;
	if (l->offsets_parts <= 0)
		return -1;
	for (const unsigned char *p = (const unsigned char *)group; *p; p++) {
		if (*p >= 0x80)
			return -1; /* String.hashCode runs over UTF-16 units: only ASCII names are hashed here */
		h = (int32_t)((uint32_t)h * 31u + *p);
	}
	return (h == INT32_MIN ? 0 : (h < 0 ? -h : h)) % l->offsets_parts;
}

static void leave(km_lease *l);
static void owners_free(km_lease *l);

/*
 * The group to join, as the state says (no record: mirror_sync_group itself). When it changed
 * (another kmirrord moved every one off a group it could not join), this one leaves the earlier
 * group, gives up its mirrors and joins the new one from scratch.
 */
static void follow_group(km_lease *l)
{
	km_state *st = km_mirror_store(l->mi);
	const km_state_sync_group *g = st ? km_state_sync_group_of(st, l->base) : NULL;
	char want[sizeof(l->group)], why[1400];

	snprintf(want, sizeof(want), "%s", g ? g->group : l->base);
	if (!strcmp(want, l->group))
		return;
	if (l->group[0]) {
		KM_WARN(COMP, 0, "mirrors: the sync group moves from %s to %s (generation %d, moved by %s: %s); "
			"this kmirrord follows", l->group, want, g ? (int)g->generation : 0, g ? g->moved_by : "an operator",
			g ? g->reason : "the record was removed");
		leave(l);
		snprintf(why, sizeof(why), "the sync group moves to %s", want);
		disown(l, why);
		owners_free(l); /* the earlier group's owners: the new one is described anew */
		l->epoch = 0;
		l->adopted = l->adopting = false;
		l->last_ok = 0;
		l->coord = -1;
		if (l->ph == L_BEAT || l->ph == L_DESCRIBE)
			l->ph = L_FIND;
		l->fail_since = 0;
		l->err_since = 0;
		l->fail_code = 0;
		l->warned_at = 0;
		later(l, 0); /* or, with a request in flight, once its answer about the earlier group is dropped */
	}
	snprintf(l->group, sizeof(l->group), "%s", want);
	l->gen = g ? g->generation : 0;
	l->group_seq++;
	report(l);
}

/* The handle of a move's write: the lease may be freed before the store answers. */
struct move_token {
	km_lease *l;
};

static void moved(void *arg, const km_state_result *res)
{
	struct move_token *tok = arg;
	km_lease *l = tok->l;

	free(tok);
	if (!l)
		return;
	l->moving = NULL;
	if (res->code != 0) {
		KM_WARN(COMP, 0, "mirrors: the move off the sync group %s could not be recorded in the state topic (%s); "
			"tried again in a second", l->group, res->message && res->message[0] ? res->message : km_err_name(res->code));
		return;
	}
	if (l->m_moves)
		km_metric_inc(l->m_moves, 1);
	follow_group(l);
}

/*
 * The group's coordinator has answered with errors for mirror_sync_group_move_after_s: its next
 * generation (on another partition of __consumer_offsets when that is known) is written to the
 * state topic, which every kmirrord follows. A group merely out of reach (no answers) is not left:
 * every group would be.
 */
static void maybe_move(km_lease *l, int64_t now)
{
	km_state *st = km_mirror_store(l->mi);
	km_state_sync_group g;
	char next[1100], reason[1400];
	int32_t gen = l->gen + 1, here = offsets_partition(l, l->group);

	if (!l->move_after_ms || !l->err_since || l->moving || !st || !km_state_ready(st) ||
	    now - l->err_since < l->move_after_ms || now - l->err_at > 10000 || l->gen >= 1000000)
		return;
	for (km_state_sync_group_name(km_str_c(l->base), gen, next, sizeof(next));
	     here >= 0 && offsets_partition(l, next) == here && gen < l->gen + 100;)
		km_state_sync_group_name(km_str_c(l->base), ++gen, next, sizeof(next));
	snprintf(reason, sizeof(reason), "%s could not be joined for %lld s: its coordinator answered %s", l->group,
		 (long long)((now - l->err_since) / 1000), km_err_name(l->fail_code));
	KM_WARN(COMP, 0, "mirrors: %s; every kmirrord moves to the group %s (mirror_sync_group_move_after_s)", reason, next);
	memset(&g, 0, sizeof(g));
	g.base = l->base;
	g.generation = gen;
	g.group = next;
	g.moved_ms = now;
	g.moved_by = (char *)km_mirror_self(l->mi);
	g.reason = reason;
	if (!(l->moving = calloc(1, sizeof(*l->moving))))
		return;
	l->moving->l = l;
	km_state_sync_group_write(st, &g, moved, l->moving);
}

static void warn_failing(km_lease *l, int64_t now)
{
	if (!l->fail_since || now - l->fail_since < FAIL_WARN_MS || (l->warned_at && now - l->warned_at < FAIL_REPEAT_MS))
		return;
	l->warned_at = now;
	if (l->move_after_ms)
		KM_WARN(COMP, 0, "mirrors: this kmirrord has not been a member of its sync group %s for %lld s (%s%s): it "
			"runs no mirror meanwhile; after %lld s of answers with an error every kmirrord moves to the "
			"group's next generation (mirror_sync_group_move_after_s)", l->group,
			(long long)((now - l->fail_since) / 1000), l->fail_code ? "its coordinator answers " : "no answer",
			l->fail_code ? km_err_name(l->fail_code) : "", (long long)(l->move_after_ms / 1000));
	else
		KM_WARN(COMP, 0, "mirrors: this kmirrord has not been a member of its sync group %s for %lld s (%s%s): it "
			"runs no mirror meanwhile; set mirror_sync_group to another group on every kmirrord of this "
			"state topic, or mirror_sync_group_move_after_s to move on its own", l->group,
			(long long)((now - l->fail_since) / 1000), l->fail_code ? "its coordinator answers " : "no answer",
			l->fail_code ? km_err_name(l->fail_code) : "");
}

static void on_response(km_net_client *c, const km_rpc_response *r, void *arg);

/* req: the km_<name>_request of key, encoded by the API table; the answer is decoded for the phase. */
static void send_req(km_lease *l, km_net_client *c, int16_t key, const void *req, int16_t ver)
{
	if (km_rpc_call(c, key, ver, req, NULL, on_response, l) == KM_OK) {
		l->inflight = true;
		l->req_seq = l->group_seq;
		l->sent_at = km_wall_ms();
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
	if (l->ph != L_ALONE) {
		KM_WARN(COMP, 0, "mirrors: %s; this kmirrord runs every mirror (with several kmirrords in front of "
			"this destination, each does: the metadata sync is repeated, never conflicting, and pipelines "
			"need mirror_pipelines = all in exactly one of them)", why);
		l->ph = L_ALONE;
		notify(l);
	}
}

/* A description ended (answered, refused or not possible): back to heartbeats, no adoption pending. */
static void describe_over(km_lease *l)
{
	l->ph = L_BEAT;
	l->adopting = false;
	l->described_at = km_wall_ms();
}

static void step(km_lease *l)
{
	km_net_client *c;
	int16_t ver;
	const char *topic = km_state_topic_name_of_store(km_mirror_store(l->mi));

	if (l->freeing || l->inflight || l->ph == L_ALONE || !l->dst)
		return;
	follow_group(l);
	/* Whatever it is doing (looking for the coordinator again too): no heartbeat for that long, no mirror. */
	if (l->last_ok && km_wall_ms() - l->last_ok > SESSION_MS) {
		disown(l, "no heartbeat answered for the session timeout");
		l->epoch = 0;
		l->last_ok = 0;
	}
	warn_failing(l, km_wall_ms());
	maybe_move(l, km_wall_ms());
	report(l);
	switch (l->ph) {
	case L_META: {
		km_metadata_request m;
		km_metadata_request_topic t[2];
		if (!(c = client(l, -1, KM_API_METADATA, 10, 12, &ver)))
			return;
		if (ver < 0)
			return alone(l, "the destination does not give topic ids in Metadata (before Kafka 2.8)");
		km_metadata_request_init(&m);
		km_metadata_request_topic_init(&t[0]);
		km_metadata_request_topic_init(&t[1]);
		t[0].name = km_str_c(topic);
		t[1].name = km_str_c(OFFSETS_TOPIC); /* its partition count: a move picks a group on another one */
		m.topics.items = t;
		m.topics.count = 2;
		m.allow_auto_topic_creation = false;
		return send_req(l, c, KM_API_METADATA, &m, ver);
	}
	case L_FIND: {
		km_find_coordinator_request m;
		km_str key = km_str_c(l->group);
		if (!(c = client(l, -1, KM_API_FIND_COORDINATOR, 4, 6, &ver)))
			return;
		if (ver < 0 || km_net_client_version(c, KM_API_CONSUMER_GROUP_HEARTBEAT) < 1)
			return alone(l, "the destination has no consumer group protocol (KIP-848, Kafka 4.0)");
		km_find_coordinator_request_init(&m);
		m.key_type = 0;
		m.coordinator_keys.items = &key;
		m.coordinator_keys.count = 1;
		return send_req(l, c, KM_API_FIND_COORDINATOR, &m, ver);
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
		for (int32_t i = 0; i < l->nparts; i++) {
			if (l->held[i] && !(l->busy && l->busy(l->changed_arg, i)))
				l->held[i] = false; /* let go of: the next owner may take it */
			if (l->owned[i] || l->held[i])
				parts[n++] = i;
		}
		km_consumer_group_heartbeat_request_init(&m);
		km_consumer_group_heartbeat_request_topic_partitions_init(&tp);
		m.group_id = km_str_c(l->group);
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
		send_req(l, c, KM_API_CONSUMER_GROUP_HEARTBEAT, &m, ver);
		free(parts); /* the request was encoded in the call */
		return;
	}
	case L_DESCRIBE: {
		km_consumer_group_describe_request m;
		km_str g = km_str_c(l->group);
		if (!(c = client(l, l->coord, KM_API_CONSUMER_GROUP_DESCRIBE, 0, 1, &ver)))
			return;
		if (ver < 0) {
			/* Cannot look: no owners to show, and a fenced rejoin waits for the earlier life to expire. */
			describe_over(l);
			return later(l, RETRY_MS);
		}
		km_consumer_group_describe_request_init(&m);
		m.group_ids.items = &g;
		m.group_ids.count = 1;
		return send_req(l, c, KM_API_CONSUMER_GROUP_DESCRIBE, &m, ver);
	}
	case L_ALONE:
		break;
	}
}

static void owners_free(km_lease *l)
{
	for (int32_t i = 0; l->owner_of && i < l->nparts; i++) {
		free(l->owner_of[i]);
		l->owner_of[i] = NULL;
	}
}

/* A member's name for describe: what its lease put after the group's name in its client id (km_mirror_self). */
static char *member_name(km_str client_id)
{
	static const char mark[] = "/" KM_SYNC_GROUP "/";
	char id[512];
	const char *at;
	snprintf(id, sizeof(id), "%.*s", client_id.len > 0 ? (int)client_id.len : 0, client_id.p ? client_id.p : "");
	at = strstr(id, mark);
	return strdup(at ? at + strlen(mark) : id);
}

/*
 * The group described: who owns each state partition (describe's Owner), and, after a join of
 * this member id was fenced, that member's epoch. The group still holds the member at the epoch
 * an earlier life of this kmirrord reached before it died (kill -9, a crash: it did not leave).
 * The member id is this kmirrord's own (member_id), so that life is over: heartbeating at its
 * epoch takes its place and its assignment at once, instead of waiting for the group to expire it
 * (the session timeout, 45 s by default) while its mirrors stand still.
 */
static void took_describe(km_lease *l, const km_consumer_group_describe_response *r)
{
	const km_consumer_group_describe_response_described_group *g = r->groups.count == 1 ? &r->groups.items[0] : NULL;
	bool adopting = l->adopting;

	describe_over(l);
	if (g && !g->error_code && l->owner_of) {
		owners_free(l);
		for (int32_t i = 0; i < g->members.count; i++) {
			const km_consumer_group_describe_response_member *m = &g->members.items[i];
			for (int32_t t = 0; t < m->assignment.topic_partitions.count; t++) {
				const km_consumer_group_describe_response_topic_partitions *tp = &m->assignment.topic_partitions.items[t];
				if (memcmp(tp->topic_id.b, l->topic_id.b, sizeof(l->topic_id.b)))
					continue;
				for (int32_t k = 0; k < tp->partitions.count; k++) {
					int32_t p = tp->partitions.items[k];
					if (p >= 0 && p < l->nparts && !l->owner_of[p])
						l->owner_of[p] = member_name(m->client_id);
				}
			}
		}
	}
	for (int32_t i = 0; adopting && g && !g->error_code && i < g->members.count; i++)
		if (km_str_eq_c(g->members.items[i].member_id, l->member) && g->members.items[i].member_epoch > 0) {
			l->epoch = g->members.items[i].member_epoch;
			KM_INFO(COMP, 0, "mirrors: this kmirrord takes the place of its earlier life in group %s (member %s, "
				"epoch %d)", l->group, l->member, (int)l->epoch);
			return later(l, 0);
		}
	later(l, adopting ? RETRY_MS : l->beat_in); /* adopting and not there (expired meanwhile): a join creates it anew */
}

static void took_meta(km_lease *l, const km_metadata_response *r)
{
	const char *topic = km_state_topic_name_of_store(km_mirror_store(l->mi));
	const km_metadata_response_topic *t = NULL;
	bool *owned;

	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_metadata_response_topic *x = &r->topics.items[i];
		if (km_str_eq_c(x->name, topic))
			t = x;
		else if (km_str_eq_c(x->name, OFFSETS_TOPIC) && !x->error_code && x->partitions.count > 0)
			l->offsets_parts = x->partitions.count;
	}
	if (km_cluster_brokers(l->dst, r) != KM_OK || !t)
		return later(l, RETRY_MS);
	if (t->error_code) {
		/* No state topic yet (no mirror created): nothing to own; look again later. */
		l->nparts = 0;
		return later(l, 5000);
	}
	if (t->partitions.count <= 0 || t->partitions.count > MAX_OWNED ||
	    !(owned = calloc((size_t)t->partitions.count * 2, sizeof(*owned))))
		return later(l, RETRY_MS);
	disown(l, "the state topic is looked up again");
	owners_free(l);
	free(l->owner_of);
	if (!(l->owner_of = calloc((size_t)t->partitions.count, sizeof(*l->owner_of)))) {
		free(owned);
		return later(l, RETRY_MS);
	}
	free(l->owned);
	l->owned = owned;
	l->held = owned + t->partitions.count;
	l->nparts = t->partitions.count;
	l->topic_id = t->topic_id;
	l->ph = L_FIND;
	later(l, 0);
}

static void took_find(km_lease *l, const km_find_coordinator_response *r)
{
	const km_find_coordinator_response_coordinator *c = r->coordinators.count == 1 ? &r->coordinators.items[0] : NULL;

	if (!c || c->error_code) {
		KM_DEBUG(COMP, 0, "mirrors: FindCoordinator of group %s: %s", l->group, km_err_name(c ? c->error_code : -1));
		failing(l, c ? c->error_code : -1);
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
	case K_FENCED_MEMBER_EPOCH:
		if (l->epoch == 0 && !l->adopted) {
			l->adopted = true;
			l->adopting = true;
			l->ph = L_DESCRIBE;
			return later(l, 0);
		}
		rejoin(l);
		return later(l, RETRY_MS);
	case K_UNKNOWN_MEMBER_ID:
		rejoin(l);
		return later(l, 0);
	case K_NOT_COORDINATOR:
	case K_COORDINATOR_NOT_AVAILABLE:
	case K_COORDINATOR_LOAD_IN_PROGRESS:
	case K_GROUP_ID_NOT_FOUND: /* a group its coordinator lost, or one of another kind under the name */
		KM_DEBUG(COMP, 0, "mirrors: heartbeat in group %s: %s", l->group, km_err_name(r->error_code));
		failing(l, r->error_code);
		l->ph = L_FIND;
		return later(l, RETRY_MS);
	case K_UNSUPPORTED_VERSION:
	case K_UNSUPPORTED_ASSIGNOR:
		return alone(l, "the destination refuses the consumer group protocol (group.coordinator.rebalance.protocols)");
	default:
		failing(l, r->error_code);
		KM_WARN(COMP, 0, "mirrors: heartbeat in group %s: %s%s%.*s", l->group, km_err_name(r->error_code),
			r->error_message.len > 0 ? ": " : "", r->error_message.len > 0 ? (int)r->error_message.len : 0,
			r->error_message.p);
		/* A state topic recreated, a changed partition count: start over. */
		l->ph = L_META;
		l->epoch = 0;
		disown(l, km_err_name(r->error_code));
		return later(l, RETRY_MS);
	}
	{
		int64_t now = km_wall_ms();
		bool was_stale = stale(l, now) || !l->last_ok;
		/*
		 * The coordinator held the membership when it read the request, which was sent at
		 * sent_at: an answer that took long (a slow or cut link, a coordinator loading) says
		 * nothing of later, when the group may have given the mirrors on. Counted from then
		 * (docs/reliability.md, finding 36).
		 */
		l->last_ok = l->sent_at > 0 ? l->sent_at : now;
		l->hb_ms = r->heartbeat_interval_ms > 0 ? r->heartbeat_interval_ms : 5000;
		recovered(l);
		if (was_stale && !stale(l, now) && l->owned_any)
			notify(l); /* its mirrors are its own again (whatever the answer's assignment adds): they run again */
	}
	l->epoch = r->member_epoch;
	l->adopted = false;
	if (r->assignment) {
		bool any = false, moved = false;
		bool *now = calloc((size_t)(l->nparts > 0 ? l->nparts : 1), sizeof(*now));
		if (!now)
			return later(l, RETRY_MS); /* the same assignment comes again with the next heartbeat */
		for (int32_t i = 0; i < r->assignment->topic_partitions.count; i++) {
			const km_consumer_group_heartbeat_response_topic_partitions *tp = &r->assignment->topic_partitions.items[i];
			if (memcmp(tp->topic_id.b, l->topic_id.b, sizeof(l->topic_id.b)))
				continue;
			for (int32_t j = 0; j < tp->partitions.count; j++)
				if (tp->partitions.items[j] >= 0 && tp->partitions.items[j] < l->nparts)
					any = now[tp->partitions.items[j]] = true;
		}
		for (int32_t i = 0; i < l->nparts; i++) {
			moved |= now[i] != l->owned[i];
			if (l->owned[i] && !now[i])
				l->held[i] = true; /* revoked: reported until this kmirrord has let go of it */
			l->owned[i] = now[i];
		}
		free(now);
		if (any != l->owned_any)
			KM_INFO(COMP, 0, "mirrors: this kmirrord %s (group %s, epoch %d)",
				any ? "runs the mirrors of its state topic partitions" : "owns no mirror now", l->group,
				(int)l->epoch);
		l->owned_any = any;
		if (moved)
			notify(l); /* the owner lets go of what it lost before a heartbeat says so */
	}
	l->beat_in = r->heartbeat_interval_ms > 0 ? r->heartbeat_interval_ms : 5000;
	for (int32_t i = 0; i < l->nparts; i++)
		if (l->held[i])
			l->beat_in = HELD_POLL_MS; /* say it is released as soon as it is */
	if (l->beat_in > HELD_POLL_MS && !l->owned_any && !r->assignment)
		l->beat_in = JOIN_POLL_MS; /* joined, nothing assigned yet: the assignor is quick, ask again soon */
	if (r->assignment || km_wall_ms() - l->described_at >= DESCRIBE_MS) {
		l->ph = L_DESCRIBE; /* who owns what now (describe's Owner); the heartbeat follows */
		return later(l, 0);
	}
	later(l, l->beat_in);
}

static void on_response(km_net_client *c, const km_rpc_response *r, void *arg)
{
	km_lease *l = arg;

	if (l->freeing)
		return;
	l->inflight = false;
	if (l->req_seq != l->group_seq)
		return later(l, 0); /* about the group left: the new one is looked up from scratch */
	if (l->ph == L_DESCRIBE && (km_rpc_undecoded(r) || r->err != KM_OK)) {
		/* The description is a help (owners, an earlier life's epoch): the heartbeats go on without it. */
		if (r->err != KM_OK && !km_rpc_undecoded(r))
			km_cluster_drop(l->dst, c);
		describe_over(l);
		return later(l, RETRY_MS);
	}
	if (km_rpc_undecoded(r))
		return later(l, RETRY_MS); /* the connection is sound: ask again */
	if (r->err != KM_OK) {
		km_cluster_drop(l->dst, c);
		if (l->ph == L_BEAT)
			l->ph = L_FIND;
		if (l->ph == L_FIND)
			failing(l, 0);
		return later(l, RETRY_MS);
	}
	switch (l->ph) {
	case L_META:
		took_meta(l, r->msg);
		break;
	case L_FIND:
		took_find(l, r->msg);
		break;
	case L_BEAT:
		took_beat(l, r->msg);
		break;
	case L_DESCRIBE:
		took_describe(l, r->msg);
		break;
	case L_ALONE:
		break;
	}
}

static void on_ev(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	step(arg);
}

static void on_watch(evutil_socket_t fd, short what, void *arg)
{
	km_lease *l = arg;
	struct timeval tv = {0, WATCH_MS * 1000};
	(void)fd;
	(void)what;
	follow_group(l);
	report(l);
	event_add(l->watch_ev, &tv);
}

static void on_cluster(void *arg)
{
	km_lease *l = arg;
	if (!l->inflight)
		later(l, 0);
}

km_lease *km_lease_new(km_mirror *mi)
{
	const km_config *cfg = km_mirror_get_opts(mi)->cfg; /* read here only: a reload frees its strings */
	km_lease *l = calloc(1, sizeof(*l));
	uint8_t rnd[16];

	if (!l)
		return NULL;
	l->mi = mi;
	l->coord = -1;
	l->hb_ms = 5000;
	if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
		free(l);
		return NULL;
	}
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(l->member + 2 * i, 3, "%02x", rnd[i]);
	if (!(l->ev = event_new(km_mirror_base(mi), -1, 0, on_ev, l)) ||
	    !(l->watch_ev = event_new(km_mirror_base(mi), -1, 0, on_watch, l))) {
		if (l->ev)
			event_free(l->ev);
		free(l);
		return NULL;
	}
	snprintf(l->base, sizeof(l->base), "%s",
		 cfg && cfg->mirror_sync_group && *cfg->mirror_sync_group ? cfg->mirror_sync_group : KM_SYNC_GROUP);
	l->move_after_ms = cfg ? cfg->mirror_sync_group_move_after_s * 1000 : 120000;
	snprintf(l->group, sizeof(l->group), "%s", l->base);
	/* mirror_pipelines = none joins no group: nothing to show. */
	if (km_mirror_get_opts(mi)->metrics && !(cfg && cfg->mirror_pipelines == KM_PIPELINES_NONE)) {
		static const km_metric_desc d[] = {
			{.name = "kmirror_mirror_sync_group_joined",
			 .help = "1 while this kmirrord's heartbeats in its sync group are answered (it runs the mirrors "
				 "the group gives it; or alone, before Kafka 4.0, running every mirror), 0 while it is not "
				 "a member (it runs none).",
			 .type = KM_METRIC_GAUGE},
			{.name = "kmirror_mirror_sync_group_generation",
			 .help = "The generation of mirror_sync_group joined: 0 is the group itself, N its N-th move "
				 "(<group>.N) off a group that could not be joined.",
			 .type = KM_METRIC_GAUGE},
			{.name = "kmirror_mirror_sync_group_moves_total",
			 .help = "Moves of every kmirrord to the sync group's next generation that this kmirrord recorded.",
			 .type = KM_METRIC_COUNTER},
		};
		km_metric_family *f[3];
		for (int i = 0; i < 3; i++)
			f[i] = km_metrics_family(km_mirror_get_opts(mi)->metrics, &d[i]);
		l->m_joined = f[0] ? km_metric_series_get(f[0], NULL) : NULL;
		l->m_gen = f[1] ? km_metric_series_get(f[1], NULL) : NULL;
		l->m_moves = f[2] ? km_metric_series_get(f[2], NULL) : NULL;
	}
	return l;
}

/*
 * The member id: this kmirrord's own across restarts (its instance name, its HTTP listener, which
 * every process on a host has apart, and the state topic), so that a restart after a crash takes
 * its earlier life's place in the group (took_adopt). Two kmirrords with the same instance name
 * (the host name) and HTTP listener in front of one destination would share it.
 */
static void member_id(km_lease *l)
{
	const km_mirror_opts *o = km_mirror_get_opts(l->mi);
	char who[1024];
	uint64_t a, b;

	if (!o->cfg)
		return; /* no configuration (a test's): the random id of km_lease_new */
	snprintf(who, sizeof(who), "%s|%s:%u|%s", o->instance ? o->instance : "", o->cfg->http_listen.host,
		 (unsigned)o->cfg->http_listen.port, km_state_topic_name_of_store(km_mirror_store(l->mi)));
	a = km_fnv1a(KM_FNV1A_INIT, who, strlen(who));
	b = km_fnv1a(a ^ 0x9e3779b97f4a7c15ull, who, strlen(who));
	snprintf(l->member, sizeof(l->member), "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

void km_lease_start(km_lease *l)
{
	if (!l || l->dst || l->ph == L_ALONE)
		return;
	member_id(l);
	/* The client id ends with this kmirrord's name: the others' describe shows it as the owner. */
	if (!(l->dst = km_mirror_dest_cluster(l->mi, KM_SYNC_GROUP, km_mirror_self(l->mi), on_cluster, l)))
		return alone(l, "no client for the destination");
	l->group[0] = 0;
	follow_group(l); /* the group the state names, if it moved */
	on_watch(-1, 0, l);
	later(l, 0);
}

static void ignore_answer(km_net_client *c, const km_rpc_response *r, void *arg)
{
	(void)c, (void)r, (void)arg;
}

/* Leave the group, so that another kmirrord takes the mirrors at once rather than after the session timeout. */
static void leave(km_lease *l)
{
	km_net_client *c = l->coord >= 0 ? km_cluster_node(l->dst, l->coord) : NULL;
	km_consumer_group_heartbeat_request m;

	if ((l->ph != L_BEAT && l->ph != L_DESCRIBE) || l->epoch <= 0 || !km_cluster_usable(l->dst, c) ||
	    km_net_client_version(c, KM_API_CONSUMER_GROUP_HEARTBEAT) < 1)
		return;
	km_consumer_group_heartbeat_request_init(&m);
	m.group_id = km_str_c(l->group);
	m.member_id = km_str_c(l->member);
	m.member_epoch = -1;
	m.instance_id = KM_STR_NULL;
	m.rack_id = KM_STR_NULL;
	m.rebalance_timeout_ms = -1;
	m.subscribed_topic_names.count = -1;
	m.subscribed_topic_regex = KM_STR_NULL;
	m.server_assignor = KM_STR_NULL;
	m.topic_partitions.count = -1;
	if (km_rpc_call(c, KM_API_CONSUMER_GROUP_HEARTBEAT, 1, &m, NULL, ignore_answer, NULL) != KM_OK)
		return;
	KM_INFO(COMP, 0, "mirrors: left the group %s", l->group);
}

void km_lease_free(km_lease *l)
{
	if (!l)
		return;
	l->freeing = true;
	if (l->moving)
		l->moving->l = NULL; /* its answer finds the lease gone */
	if (l->dst)
		leave(l);
	km_cluster_free(l->dst);
	if (l->ev)
		event_free(l->ev);
	if (l->watch_ev)
		event_free(l->watch_ev);
	owners_free(l);
	free(l->owner_of);
	free(l->owned);
	free(l);
}

void km_lease_on_change(km_lease *l, void (*changed)(void *arg), bool (*busy)(void *arg, int32_t slot), void *arg)
{
	l->changed = changed;
	l->busy = busy;
	l->changed_arg = arg;
}

const char *km_lease_owner(const km_lease *l, const char *mirror)
{
	int32_t k = km_lease_slot(l, mirror);
	return k >= 0 && l->ph != L_ALONE && l->owner_of ? l->owner_of[k] : NULL;
}

bool km_lease_stale(const km_lease *l)
{
	return l && stale(l, km_wall_ms());
}

int32_t km_lease_slot(const km_lease *l, const char *mirror)
{
	if (!l || l->nparts <= 0)
		return -1;
	return (int32_t)(km_fnv1a(KM_FNV1A_INIT, mirror, strlen(mirror)) % (uint64_t)l->nparts);
}

bool km_lease_owns(const km_lease *l, const char *mirror)
{
	int32_t k;

	if (!l || l->ph == L_ALONE)
		return true;
	if (!l->owned || (k = km_lease_slot(l, mirror)) < 0 || stale(l, km_wall_ms()))
		return false;
	return l->owned[k];
}


const char *km_lease_group(const km_lease *l)
{
	return l ? l->group : KM_SYNC_GROUP;
}

bool km_mirror_is_sync_group(km_mirror *mi, const char *name)
{
	const km_config *cfg = km_mirror_get_opts(mi)->cfg;
	return km_state_is_sync_group(KM_SYNC_GROUP, name) ||
	       (cfg && cfg->mirror_sync_group && *cfg->mirror_sync_group && km_state_is_sync_group(cfg->mirror_sync_group, name));
}
