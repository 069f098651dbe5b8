/*
 * __mirror_state followed after the load (docs/state.md, "Following"): every partition long-polled
 * from where the load (or the last round) ended, its records into the load's map; a round that
 * reached every partition's high watermark and took a record another producer wrote rebuilds the
 * model from the map, and the store takes it as it takes a reread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/fetch_request.h"
#include "state/persist_int.h"

#define FOLLOW_WAIT_MS 100  /* a Fetch's long poll: how long a broker holds an answer with nothing new (a round waits for every leader) */
#define FOLLOW_META_MS 1000 /* how often the topic's metadata is asked while it does not exist */

static void follow_round(km_state_persist *io);
static void own_clear(km_state_persist *io);

static void on_follow_ev(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	follow_round(arg);
}

void km_ps_follow_kick(km_state_persist *io, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	if (io->closing)
		return;
	if (!io->fev && !(io->fev = evtimer_new(io->st->base, on_follow_ev, io)))
		return; /* out of memory: the next operation's end tries again */
	event_add(io->fev, &tv);
}

void km_ps_follow_free(km_state_persist *io)
{
	km_cluster_free(io->fcl); /* pending answers see io->closing */
	if (io->fev)
		event_free(io->fev);
	free(io->fpos);
	free(io->fhw);
	own_clear(io);
	free(io->own);
}

/*
 * Following has connections of its own: a broker answers one connection's requests in order, so a
 * write behind a Fetch long-polled on the same connection would wait for it.
 */
static void on_follow_change(void *arg)
{
	km_state_persist *io = arg;
	km_net_client *c = io->fwait;

	if (io->closing || !c)
		return;
	if (km_cluster_failed(io->fcl, c)) {
		/* It could not connect: the next round after a backoff, not a new connection at once. */
		io->fwait = NULL;
		io->ffail = true;
		km_ps_follow_kick(io, km_ps_next_backoff(&io->backoff_ms));
	} else if (km_net_client_ready(c)) {
		io->fwait = NULL;
		km_ps_follow_kick(io, 0);
	}
}

static km_cluster *fcluster(km_state_persist *io)
{
	if (!io->fcl)
		io->fcl = km_ps_cluster_new(io, on_follow_change);
	return io->fcl;
}

/* The client of broker id (its address as the persister's metadata has it); NULL without one. */
static km_net_client *fnode(km_state_persist *io, int32_t id)
{
	const char *host;
	uint16_t port;
	bool moved;

	if (!fcluster(io) || !km_cluster_addr(io->cl, id, &host, &port) ||
	    km_cluster_learn(io->fcl, id, host, strlen(host), port, &moved) != KM_OK)
		return NULL;
	if (moved)
		io->fwait = NULL; /* the cluster let its old client go: it may be the one waited for */
	return km_cluster_node(io->fcl, id);
}

/* Whether c can be sent to now (or never will: the send then fails); else the round waits for it. */
static bool fready(km_state_persist *io, km_net_client *c)
{
	if (!c || km_cluster_failed(io->fcl, c) || km_net_client_ready(c))
		return true;
	io->fwait = c;
	return false;
}

static void fdrop(km_state_persist *io, km_net_client *c)
{
	if (!c || !io->fcl)
		return;
	if (io->fwait == c)
		io->fwait = NULL;
	km_cluster_drop(io->fcl, c);
}

bool km_ps_follow_positions(km_state_persist *io)
{
	int64_t *np, *nh;

	if (io->fparts == io->nparts && io->fpos)
		return true;
	if (io->nparts <= 0 || !(np = realloc(io->fpos, (size_t)io->nparts * sizeof(*np))))
		return false;
	io->fpos = np;
	if (!(nh = realloc(io->fhw, (size_t)io->nparts * sizeof(*nh))))
		return false;
	io->fhw = nh;
	for (int32_t p = io->fparts; p < io->nparts; p++)
		io->fpos[p] = io->fhw[p] = 0;
	io->fparts = io->nparts;
	return true;
}

/* One record of this kmirrord's, acknowledged at offset of state partition part. */
struct km_ps_own {
	int32_t part;
	int64_t offset;
	uint8_t *key, *val; /* val NULL: a tombstone */
	size_t klen, vlen;
};

static void own_free(struct km_ps_own *o)
{
	free(o->key);
	free(o->val);
}

/* Keeps the acknowledged records following has not read yet; drops those it has. */
static void own_prune(km_state_persist *io)
{
	size_t k = 0;
	for (size_t i = 0; i < io->nown; i++) {
		struct km_ps_own *o = &io->own[i];
		if (o->part < io->fparts && io->fpos && o->offset < io->fpos[o->part])
			own_free(o);
		else
			io->own[k++] = *o;
	}
	io->nown = k;
}

static void own_clear(km_state_persist *io)
{
	for (size_t i = 0; i < io->nown; i++)
		own_free(&io->own[i]);
	io->nown = 0;
}

void km_ps_follow_acked(km_state_persist *io, int32_t partition, int64_t base)
{
	int64_t at = base;

	if (base < 0) {
		io->wblind_at = io->fstarted; /* where they landed is not known: only a round started after this one */
		return;
	}
	for (size_t i = 0; i < io->nrecs; i++) {
		struct km_ps_own *o;
		if (io->rpart[i] != partition)
			continue;
		if (io->nown == io->capown) {
			size_t nc = io->capown ? io->capown * 2 : 16;
			struct km_ps_own *no = realloc(io->own, nc * sizeof(*no));
			if (!no) {
				io->wblind_at = io->fstarted;
				return;
			}
			io->own = no;
			io->capown = nc;
		}
		o = &io->own[io->nown];
		o->part = partition;
		o->offset = at++;
		o->klen = io->recs[i].klen;
		o->vlen = io->recs[i].vlen;
		o->key = malloc(o->klen ? o->klen : 1);
		o->val = io->recs[i].val ? malloc(o->vlen ? o->vlen : 1) : NULL;
		if (!o->key || (io->recs[i].val && !o->val)) {
			own_free(o);
			io->wblind_at = io->fstarted;
			return;
		}
		memcpy(o->key, io->recs[i].key, o->klen);
		if (o->val)
			memcpy(o->val, io->recs[i].val, o->vlen);
		io->nown++;
	}
}

void km_ps_follow_drop(km_state_persist *io)
{
	io->fgen++;
	io->fround = false;
	io->fout = 0;
	io->freload = false;
	/* The load reads every partition to its end: what was acknowledged before is in it (and the topic may be new). */
	own_clear(io);
	io->wblind_at = 0;
}

uint64_t km_state_persist_follow_ticket(const km_state_persist *io)
{
	return io->fstarted + 1;
}

bool km_state_persist_follow_reached(const km_state_persist *io, uint64_t ticket)
{
	return io->fapplied >= ticket;
}

/* The round is over: apply what it completed, and go on (at once: the long poll paces it). */
static void follow_end(km_state_persist *io)
{
	km_state_model m;
	size_t bad;
	bool caught_up = true;

	io->fround = false;
	free(io->scratch);
	io->scratch = NULL;
	if (io->ffail) {
		km_ps_follow_kick(io, km_ps_next_backoff(&io->fbackoff_ms));
		return;
	}
	io->fbackoff_ms = 0;
	/*
	 * Only at every partition's high watermark: what one change wrote to several partitions is
	 * then all in (kmirrord writes acks=all, so a change acknowledged before this round began is
	 * below them). The model is rebuilt from what was read, and this kmirrord's own records
	 * acknowledged meanwhile (in the model since) that the round did not read yet are applied to it
	 * again, after what was read of their partitions (a key lives in one partition, so each key's
	 * order holds).
	 */
	own_prune(io);
	for (int32_t p = 0; p < io->fparts; p++)
		if (io->fpos[p] < io->fhw[p])
			caught_up = false;
	if (io->fstarted <= io->wblind_at)
		caught_up = false;
	if (caught_up)
		io->fapplied = io->fstarted;
	if (caught_up && io->fdirty) {
		bool ok = km_ps_build_model(io, &m, &bad) == KM_OK;
		for (size_t i = 0; ok && i < io->nown; i++) {
			km_state_change chg;
			const struct km_ps_own *o = &io->own[i];
			if (km_state_model_apply(&m, o->key, o->klen, o->val, o->vlen, o->val == NULL, &chg) != KM_OK)
				bad++; /* as a load counts a record that does not apply */
		}
		if (ok && io->nown && km_state_model_index(&m) != KM_OK) {
			km_state_model_free(&m);
			ok = false;
		}
		if (!ok) {
			KM_WARN(COMP, 0, "following %s: out of memory building the state; retrying",
				io->st->cfg.mirror_state_topic);
			km_ps_follow_kick(io, km_ps_next_backoff(&io->fbackoff_ms));
			return;
		}
		km_state_followed(io->st, &m, io->foldest_ms > 0 ? (double)(km_wall_ms() - io->foldest_ms) / 1000.0 : -1);
		io->fdirty = false;
		io->foldest_ms = -1;
	}
	km_ps_follow_kick(io, 0);
}

static void on_follow_fetch(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	const km_fetch_response *r = rr->msg;
	const char *bad;

	if (!io)
		return; /* another operation began since: its end starts the next round */
	if (km_rpc_transport_err(rr) != KM_OK) {
		fdrop(io, c);
		io->ffail = true;
	} else if (rr->err != KM_OK || r->error_code) {
		KM_DEBUG(COMP, 0, "following %s: Fetch from broker %d: %s", io->st->cfg.mirror_state_topic, (int)x.node_id,
			 km_err_name(rr->err != KM_OK ? rr->err : r->error_code));
		io->ffail = true;
	}
	for (int32_t i = 0; !io->ffail && i < r->responses.count; i++)
		for (int32_t j = 0; j < r->responses.items[i].partitions.count; j++) {
			const km_fetch_response_partition_data *pd = &r->responses.items[i].partitions.items[j];
			int32_t p = pd->partition_index;
			int64_t before;
			if (p < 0 || p >= io->fparts)
				continue;
			if (pd->error_code) {
				/* A leader moved, or the log was truncated below where this kmirrord read. */
				KM_DEBUG(COMP, 0, "following %s-%d: %s", io->st->cfg.mirror_state_topic, (int)p,
					 km_err_name(pd->error_code));
				io->ffail = true;
				if (pd->error_code == K_ERR_OFFSET_OUT_OF_RANGE) {
					/* Read again when no write runs (follow_round): the load rebuilds the map. */
					KM_WARN(COMP, 0, "following %s-%d: offset %lld is out of range; reading the topic again",
						io->st->cfg.mirror_state_topic, (int)p, (long long)io->fpos[p]);
					io->freload = true;
				}
				continue;
			}
			before = io->fpos[p];
			io->fhw[p] = pd->high_watermark;
			/* The records are a range of the answer, valid during this callback: read them now. */
			if ((bad = km_ps_take_records(io, pd, &io->fpos[p], INT64_MAX, &io->fdirty, &io->foldest_ms))) {
				KM_WARN(COMP, 0, "following %s-%d: %s; retrying", io->st->cfg.mirror_state_topic, (int)p, bad);
				io->ffail = true;
				break;
			}
			/* Nothing below the high watermark: compaction removed what was there. */
			if (io->fpos[p] == before && pd->records.len <= 0 && io->fhw[p] > io->fpos[p])
				io->fpos[p] = io->fhw[p];
		}
	if (--io->fout == 0)
		follow_end(io);
}

/* One Fetch to broker id for every state partition it leads. */
static km_err follow_fetch(km_state_persist *io, int32_t id, km_net_client *c)
{
	km_fetch_request m;
	km_fetch_request_fetch_topic t;
	km_fetch_request_fetch_partition *ps = calloc((size_t)io->fparts, sizeof(*ps));
	int16_t ver;
	km_err rc;
	char why[200];

	if (!ps)
		return KM_ERR_NOMEM;
	if (!c || !km_net_client_ready(c)) {
		free(ps);
		return KM_ERR_CLOSED; /* its connection failed */
	}
	if ((ver = km_ps_version_for(c, KM_API_FETCH, why, sizeof(why))) < 0) {
		free(ps);
		return KM_ERR_UNSUPPORTED;
	}
	km_fetch_request_init(&m);
	km_fetch_request_fetch_topic_init(&t);
	m.max_wait_ms = FOLLOW_WAIT_MS;
	m.min_bytes = 1;
	m.max_bytes = FETCH_BYTES;
	m.isolation_level = 0;
	for (int32_t p = 0; p < io->fparts; p++) {
		if (io->leaders[p] != id)
			continue;
		km_fetch_request_fetch_partition_init(&ps[t.partitions.count]);
		ps[t.partitions.count].partition = p;
		ps[t.partitions.count].fetch_offset = io->fpos[p];
		ps[t.partitions.count].partition_max_bytes = FETCH_BYTES;
		t.partitions.count++;
	}
	t.topic = km_str_c(io->st->cfg.mirror_state_topic);
	t.partitions.items = ps;
	m.topics.items = &t;
	m.topics.count = 1;
	rc = km_ps_send_follow_req(io, c, KM_API_FETCH, ver, &m, on_follow_fetch, id);
	free(ps);
	return rc;
}

static void follow_checked(km_state_persist *io)
{
	io->fchecked = true;
	io->ph = PH_IDLE;
	km_ps_follow_kick(io, 0);
}

static void follow_check_failed(km_state_persist *io, const char *why)
{
	KM_WARN(COMP, 0, "following %s: its cleanup.policy could not be checked (%s); retrying",
		io->st->cfg.mirror_state_topic, why);
	io->ph = PH_IDLE;
	km_ps_follow_kick(io, km_ps_next_backoff(&io->backoff_ms));
}

static void on_follow_meta(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	int16_t terr = 0;
	km_err rc = rr->err;

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK)
		fdrop(io, c);
	else if (rc == KM_OK)
		rc = km_ps_take_metadata(io, rr->msg, &terr);
	io->ph = PH_IDLE;
	if (rc != KM_OK || (!io->exists && terr != K_ERR_UNKNOWN_TOPIC)) {
		km_ps_follow_kick(io, km_ps_next_backoff(&io->backoff_ms));
		return;
	}
	if (!io->exists) {
		km_ps_follow_kick(io, FOLLOW_META_MS); /* nobody created it yet */
		return;
	}
	io->ffail = false;
	io->backoff_ms = 0;
	if (!io->fchecked) {
		/* Made by another kmirrord (or by hand) since the load: checked before a record is used. */
		io->ph = PH_FOLLOW;
		km_ps_check_policy(io, follow_checked, follow_check_failed, km_ps_refused);
		return;
	}
	km_ps_follow_kick(io, 0);
}

/* Metadata of the state topic: its existence, partitions and leaders. */
static void follow_meta(km_state_persist *io)
{
	char *name = io->st->cfg.mirror_state_topic;
	km_net_client *c = fcluster(io) ? km_cluster_any(io->fcl) : NULL;
	int16_t ver;
	char why[200];

	if (!fready(io, c))
		return;
	io->ph = PH_FOLLOW;
	io->gen++;
	if (!c || !km_net_client_ready(c) || (ver = km_ps_version_for(c, KM_API_METADATA, why, sizeof(why))) < 0 ||
	    km_ps_send_metadata(io, c, ver, &name, 1, on_follow_meta) != KM_OK) {
		fdrop(io, c);
		io->ph = PH_IDLE;
		km_ps_follow_kick(io, km_ps_next_backoff(&io->backoff_ms));
	}
}

/*
 * A round: one Fetch to each state partition leader, from where this kmirrord read. It runs beside
 * a write (they have connections of their own, and a write's records reach the model when it is
 * acknowledged), not beside a load or the follow's own metadata steps, which run as the persister's
 * one operation (io->ph) when nothing else does.
 */
static void follow_round(km_state_persist *io)
{
	if (io->closing || io->fround || io->st->fatal[0] || !io->st->ready || (io->ph != PH_IDLE && io->ph != PH_WRITE))
		return; /* the running round's or operation's end starts the next round */
	if (io->freload || !io->exists || io->ffail || !io->fchecked || !io->leaders) {
		if (io->ph != PH_IDLE)
			return; /* the write's end starts it */
		if (io->freload) {
			io->freload = false;
			km_state_persist_load(io);
			return;
		}
		follow_meta(io);
		return;
	}
	if (!km_ps_follow_positions(io)) {
		km_ps_follow_kick(io, km_ps_next_backoff(&io->fbackoff_ms));
		return;
	}
	/* Every leader's client first (a client's change resumes the round), then one Fetch each. */
	for (int32_t p = 0; p < io->fparts; p++)
		if (!fready(io, fnode(io, io->leaders[p])))
			return;
	io->fround = true;
	io->fgen++;
	io->fstarted++;
	io->fout = 0;
	io->ffail = false;
	for (int32_t p = 0; p < io->fparts; p++) {
		bool sent = false;
		for (int32_t q = 0; q < p; q++)
			sent |= io->leaders[q] == io->leaders[p];
		if (sent)
			continue;
		if (follow_fetch(io, io->leaders[p], fnode(io, io->leaders[p])) != KM_OK)
			io->ffail = true;
		else
			io->fout++;
	}
	if (io->fout == 0)
		follow_end(io);
}
