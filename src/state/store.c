/* The state store's API: validation against the committed state, the FIFO of mutations (offset map runs too), and the read views. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <openssl/crypto.h>

#include "kmirror/net.h"
#include "kmirror/secret.h"
#include "state/state_int.h"

#define COMP "state"

typedef enum { MUT_CREATE, MUT_ALTER, MUT_DELETE, MUT_TOPICS, MUT_PSET, MUT_RUNS, MUT_GROW, MUT_WRITER, MUT_PROGRESS, MUT_INSTANCE,
	       MUT_SYNC_GROUP, MUT_SOURCE_ID, MUT_REWRITE } mut_kind;

/* A mirror's delete, in writes that each land whole before the next: runs, then partitions, then the mirror. */
enum { DEL_RUNS = 0, DEL_PARTITIONS, DEL_MIRROR };

struct km_state_mut {
	mut_kind kind;
	km_state *st;
	char *mirror;
	km_state_kv *kv;
	size_t nkv;
	bool validate_only;
	km_topic_op op;
	bool by_pattern;       /* a start by the mirror's topic patterns */
	char **topics;
	size_t ntopics;
	int32_t *parts;        /* partition sets: the partitions to move */
	size_t nparts;
	km_mp_state to;
	char *error;
	km_state_run *runs;    /* runs writes: the records asked for (topic names owned); progress: logical only */
	size_t nruns;
	uint64_t term;         /* a pipeline's write: the ownership term it was asked in (km_state_owner_check) */
	int64_t writer_pid, writer_start; /* a writer write: the partition is parts[0] of topics[0] */
	int16_t writer_epoch;
	km_uuid source_id;     /* a source id write: every partition of topics[0] */
	km_wr value;           /* an instance or sync group write (its key's string in mirror): its value, encoded when asked */
	km_state_done_cb done;
	void *arg;
	/* the outcome */
	km_err code;
	char message[512];
	km_state_topic_result *tres;
	char (*tmsg)[512];
	bool *tpending;        /* start: passed the state checks, waits for the destination's metadata */
	km_state_rec *recs;
	size_t nrecs, caprecs;
	int del_phase;         /* delete: DEL_RUNS, DEL_PARTITIONS, DEL_MIRROR (each write in before the next) */
	size_t del_runs_left;  /* delete: runs left before the last run write (a write must shrink it) */
	km_state_mut *next;
};

static char *sdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

static void mut_free(km_state_mut *mu)
{
	free(mu->mirror);
	for (size_t i = 0; i < mu->nkv; i++) {
		free((char *)mu->kv[i].name);
		if (mu->kv[i].value) {
			OPENSSL_cleanse((char *)mu->kv[i].value, strlen(mu->kv[i].value));
			free((char *)mu->kv[i].value);
		}
	}
	free(mu->kv);
	for (size_t i = 0; i < mu->ntopics; i++)
		free(mu->topics[i]);
	free(mu->topics);
	free(mu->error);
	free(mu->parts);
	for (size_t i = 0; i < mu->nruns; i++)
		free((char *)mu->runs[i].topic);
	free(mu->runs);
	free(mu->tres);
	free(mu->tmsg);
	free(mu->tpending);
	for (size_t i = 0; i < mu->nrecs; i++) {
		free(mu->recs[i].key);
		free(mu->recs[i].val);
	}
	free(mu->recs);
	km_wr_free(&mu->value);
	free(mu);
}

static void set_msg(km_state_mut *mu, km_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_msg(km_state_mut *mu, km_err code, const char *fmt, ...)
{
	va_list ap;
	mu->code = code;
	va_start(ap, fmt);
	vsnprintf(mu->message, sizeof(mu->message), fmt, ap);
	va_end(ap);
}

static void topic_msg(km_state_mut *mu, size_t i, km_err code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void topic_msg(km_state_mut *mu, size_t i, km_err code, const char *fmt, ...)
{
	va_list ap;
	mu->tres[i].code = code;
	va_start(ap, fmt);
	vsnprintf(mu->tmsg[i], sizeof(mu->tmsg[i]), fmt, ap);
	va_end(ap);
	mu->tres[i].message = mu->tmsg[i];
}

/* Answer the mutation and free it. */
static void answer(km_state_mut *mu)
{
	km_state_result res = {.code = mu->code, .message = mu->code != KM_OK && mu->message[0] ? mu->message : NULL};
	if (mu->kind == MUT_TOPICS) {
		for (size_t i = 0; i < mu->ntopics; i++) {
			mu->tres[i].topic = mu->topics[i];
			if (mu->code != KM_OK && mu->tres[i].code == KM_OK) {
				/* A top-level failure (unknown mirror, write failed) is every topic's outcome. */
				mu->tres[i].code = mu->code;
				mu->tres[i].message = mu->message;
			}
		}
		res.topics = mu->tres;
		res.ntopics = mu->ntopics;
	}
	if (mu->done)
		mu->done(mu->arg, &res);
	mut_free(mu);
}

static void schedule(km_state *st)
{
	struct timeval tv = {0, 0};
	if (st->kick)
		event_add(st->kick, &tv);
}

static void finish_head(km_state *st)
{
	km_state_mut *mu = st->head;
	st->head = mu->next;
	if (!st->head)
		st->tail = NULL;
	st->queued--;
	st->finished++;
	st->running = false;
	answer(mu);
	schedule(st);
}

/* ---- records ---- */

static km_err add_rec(km_state_mut *mu, const km_state_key *k, km_wr *val)
{
	km_wr kw;
	km_state_rec *r;

	if (mu->nrecs == mu->caprecs) {
		size_t nc = mu->caprecs ? mu->caprecs * 2 : 8;
		km_state_rec *nr = realloc(mu->recs, nc * sizeof(*nr));
		if (!nr)
			return KM_ERR_NOMEM;
		mu->recs = nr;
		mu->caprecs = nc;
	}
	km_wr_init(&kw);
	km_state_key_encode(&kw, k);
	if (!km_wr_ok(&kw) || (val && !km_wr_ok(val))) {
		km_wr_free(&kw);
		return KM_ERR_NOMEM;
	}
	r = &mu->recs[mu->nrecs++];
	r->key = km_wr_take(&kw, &r->klen);
	r->val = NULL;
	r->vlen = 0;
	if (val)
		r->val = km_wr_take(val, &r->vlen);
	return KM_OK;
}

static km_err add_mirror_tombstone(km_state_mut *mu)
{
	km_state_key k = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c(mu->mirror)};
	return add_rec(mu, &k, NULL);
}

static void recs_clear(km_state_mut *mu)
{
	for (size_t i = 0; i < mu->nrecs; i++) {
		free(mu->recs[i].key);
		free(mu->recs[i].val);
	}
	mu->nrecs = 0;
}

static km_err add_partition_rec(km_state_mut *mu, const km_state_topic *t, int32_t index, const km_state_part *p)
{
	km_state_key k = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c(t->mirror->name),
			  .topic = km_str_c(t->name), .partition = index};
	km_wr w;
	km_err rc;

	km_wr_init(&w);
	if (p) {
		rc = km_state_partition_value_encode(&w, t, p);
		if (rc != KM_OK) {
			km_wr_free(&w);
			return rc;
		}
	}
	rc = add_rec(mu, &k, p ? &w : NULL);
	km_wr_free(&w);
	return rc;
}

/*
 * The runner's record of partition index of t, under p's partition record (docs/state.md, "The
 * runner's record"); p NULL: its tombstone.
 */
static km_err add_progress_rec(km_state_mut *mu, const km_state_topic *t, int32_t index, const km_state_part *p)
{
	km_state_key k = {.type = KM_STATE_REC_PROGRESS, .mirror = km_str_c(t->mirror->name),
			  .topic = km_str_c(t->name), .partition = index};
	km_wr w;
	km_err rc;

	km_wr_init(&w);
	if (p && (rc = km_state_progress_value_encode(&w, t, p, p->last_mirrored_offset, p->last_mirrored_epoch,
						       p->has_open_txn ? p->open_txn_offset : -1)) != KM_OK) {
		km_wr_free(&w);
		return rc;
	}
	rc = add_rec(mu, &k, p ? &w : NULL);
	km_wr_free(&w);
	return rc;
}

/* A partition's writer record (type 5): pid NULL: its tombstone. */
static km_err add_writer_rec(km_state_mut *mu, const km_state_topic *t, int32_t index, int64_t started_ms,
			     const int64_t *pid, int16_t epoch, int64_t start)
{
	km_state_key k = {.type = KM_STATE_REC_WRITER, .mirror = km_str_c(t->mirror->name),
			  .topic = km_str_c(t->name), .partition = index};
	km_wr w;
	km_err rc;

	km_wr_init(&w);
	if (pid && (rc = km_state_writer_value_encode(&w, t, started_ms, *pid, epoch, start)) != KM_OK) {
		km_wr_free(&w);
		return rc;
	}
	rc = add_rec(mu, &k, pid ? &w : NULL);
	km_wr_free(&w);
	return rc;
}

/*
 * The change time of a new partition record replacing old's: now, or just past old's where that is
 * not earlier (another kmirrord's clock ahead of this one's), so that every partition record's
 * change time is later than the one it replaces: a runner's record written under an earlier one is
 * known for a stale one, whatever order records are read in (km_state_progress_stale).
 */
static int64_t next_change_ms(const km_state_part *old, int64_t now)
{
	return old && old->present && old->rec.state_change_ms >= now ? old->rec.state_change_ms + 1 : now;
}

/* A partition's first record (a start, a partition added): s since now, nothing mirrored, no writer. */
static km_state_part fresh_part(km_mp_state s, int64_t now, bool by_pattern)
{
	km_state_part p = {.state = s, .state_change_ms = now, .last_mirrored_offset = -1, .last_mirrored_epoch = -1,
			   .last_error_ms = -1, .by_pattern = by_pattern, .progress_apart = true, .started_ms = now};
	p.rec.state = s;
	p.rec.state_change_ms = now; /* a progress record written with it is written under it */
	return p;
}

/*
 * The runner's record of partition index of t from p, its view with the runner's change made
 * (progress, writer, source topic id): the progress record, never the partition record, which is
 * the control plane's (docs/state.md, "The runner's record"). A partition record an older kmirrord
 * wrote is written again first, saying that the progress is kept apart.
 */
static km_err add_runner_rec(km_state_mut *mu, const km_state_topic *t, int32_t index, const km_state_part *p)
{
	km_err rc = p->progress_apart ? KM_OK : add_partition_rec(mu, t, index, p);
	return rc != KM_OK ? rc : add_progress_rec(mu, t, index, p);
}

/* ---- mirrors ---- */

static int cfg_cmp(const void *a, const void *b)
{
	return strcmp(((const km_state_cfg_entry *)a)->name, ((const km_state_cfg_entry *)b)->name);
}

static bool mirror_name_ok(const char *name, char *why, size_t len)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > KM_STATE_MAX_NAME) {
		snprintf(why, len, "a mirror name must have 1 to %d characters", KM_STATE_MAX_NAME);
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-')) {
			snprintf(why, len, "mirror name '%s' may hold only ASCII letters, digits, '.', '_' and '-'", name);
			return false;
		}
	}
	return true;
}

/* Build the mirror value record of name with entries cfg (sealing secrets) into mu. */
static void write_mirror(km_state *st, km_state_mut *mu, const char *name, int64_t created,
			 km_state_cfg_entry *cfg, size_t ncfg)
{
	km_state_mirror tmp = {.name = (char *)name, .created_ms = created, .modified_ms = km_wall_ms(), .cfg = cfg,
			       .ncfg = ncfg};
	km_state_key k = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c(name)};
	km_wr w;

	qsort(cfg, ncfg, sizeof(*cfg), cfg_cmp);
	km_wr_init(&w);
	if (km_state_mirror_value_encode(&w, &tmp) != KM_OK || add_rec(mu, &k, &w) != KM_OK)
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
	km_wr_free(&w);
	(void)st;
}

/*
 * An entry of base into c, as the next write of base carries it: a secret of format 0 sealed again
 * in format 1 (bound to the mirror) unless the write replaces it; one that does not open is carried
 * as it is (its use says why).
 */
static void copy_entry(km_state *st, km_state_mut *mu, const km_state_mirror *base, const km_state_cfg_entry *e,
		       km_state_cfg_entry *c)
{
	uint8_t *again = NULL;
	size_t len = 0;
	bool replaced = false;

	c->name = strdup(e->name);
	c->value = sdup(e->value);
	if (!e->sealed)
		return;
	for (size_t i = 0; i < mu->nkv; i++)
		replaced = replaced || !strcmp(mu->kv[i].name, e->name);
	if (!replaced && st->have_key &&
	    km_state_reseal(st->key, base->name, e->name, e->sealed, e->sealed_len, &again, &len) == KM_OK && again) {
		KM_INFO(COMP, 0, "mirror '%s': %s is sealed again in format %d (bound to the mirror) with this write",
			base->name, e->name, KM_STATE_SEAL_V1);
		c->sealed = again;
		c->sealed_len = len;
		return;
	}
	if ((c->sealed = malloc(e->sealed_len + 1))) {
		memcpy(c->sealed, e->sealed, e->sealed_len);
		c->sealed_len = e->sealed_len;
	}
}

/* Entries from the operator's kv (on top of base for alter), secrets sealed; NULL with mu's code set on failure. */
/*
 * Whether an alter points the mirror at another place: bootstrap.servers or security.protocol set
 * to another value or removed. Its stored secrets then stay behind, unless given again: a password
 * for one cluster must never be sent to another host, or in the clear.
 */
static bool moves_source(const km_state_mut *mu, const km_state_mirror *base)
{
	static const char *const where[] = {"bootstrap.servers", "security.protocol"};
	for (size_t i = 0; i < mu->nkv; i++)
		for (size_t w = 0; w < sizeof(where) / sizeof(where[0]); w++) {
			const char *now = NULL;
			if (strcmp(mu->kv[i].name, where[w]) != 0)
				continue;
			for (size_t j = 0; j < base->ncfg; j++)
				if (!strcmp(base->cfg[j].name, where[w]))
					now = base->cfg[j].value;
			if (!now || !mu->kv[i].value || strcmp(now, mu->kv[i].value) != 0)
				return true;
		}
	return false;
}

/* Whether the alter gives key name again. */
static bool given(const km_state_mut *mu, const char *name)
{
	for (size_t i = 0; i < mu->nkv; i++)
		if (!strcmp(mu->kv[i].name, name))
			return true;
	return false;
}

static km_state_cfg_entry *merge_cfg(km_state *st, km_state_mut *mu, const km_state_mirror *base, size_t *n)
{
	size_t cap = (base ? base->ncfg : 0) + mu->nkv, cnt = 0;
	km_state_cfg_entry *c = calloc(cap ? cap : 1, sizeof(*c));
	bool moved = base && moves_source(mu, base);

	if (!c) {
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
		return NULL;
	}
	for (size_t i = 0; base && i < base->ncfg; i++) {
		if (moved && base->cfg[i].sealed && !given(mu, base->cfg[i].name)) {
			KM_WARN(COMP, 0, "mirror '%s': %s dropped: the alter changes bootstrap.servers or security.protocol, "
				"and a stored secret is never sent to another place; give it again in the same alter",
				base->name, base->cfg[i].name);
			continue;
		}
		copy_entry(st, mu, base, &base->cfg[i], &c[cnt++]);
	}
	for (size_t i = 0; i < mu->nkv && mu->code == KM_OK; i++) {
		size_t at = cnt;
		for (size_t j = 0; j < cnt; j++)
			if (!strcmp(c[j].name, mu->kv[i].name))
				at = j;
		if (at < cnt) {
			free(c[at].value);
			free(c[at].sealed);
			c[at].value = NULL;
			c[at].sealed = NULL;
			c[at].sealed_len = 0;
		} else {
			c[cnt++].name = strdup(mu->kv[i].name);
		}
		if (!mu->kv[i].value) { /* removed */
			free(c[at].name);
			c[at] = c[--cnt];
			continue;
		}
		if (km_state_config_is_secret(mu->kv[i].name)) {
			if (km_state_seal(st->key, mu->mirror, mu->kv[i].name, mu->kv[i].value, &c[at].sealed,
					  &c[at].sealed_len) != KM_OK)
				set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "could not encrypt %s", mu->kv[i].name);
		} else {
			c[at].value = strdup(mu->kv[i].value);
		}
	}
	*n = cnt;
	if (mu->code != KM_OK) {
		for (size_t i = 0; i < cnt; i++) {
			free(c[i].name);
			free(c[i].value);
			free(c[i].sealed);
		}
		free(c);
		return NULL;
	}
	return c;
}

static void free_cfg(km_state_cfg_entry *c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(c[i].name);
		free(c[i].value);
		free(c[i].sealed);
	}
	free(c);
}

/*
 * A Krb5LoginModule line's keyTab, which kmirrord reads like an ssl.*.location file; false with
 * why. A mirror names its own keytab: kmirrord's ticket cache (useTicketCache) is not its to lend.
 */
static bool check_keytab(km_state *st, const char *jaas, char *why, size_t len)
{
	char *kt, *pr, *svc;
	bool ok;

	if (!strstr(jaas, "Krb5LoginModule"))
		return true;
	if (km_sasl_krb5_jaas(jaas, &kt, &pr, &svc, why, len) != KM_OK)
		return false;
	if (!kt)
		snprintf(why, len, "sasl.jaas.config: a mirror's Kerberos identity is a keytab (useKeyTab=true keyTab=\"FILE\" "
			 "principal=\"NAME@REALM\"), never kmirrord's own ticket cache");
	ok = kt && km_mirror_file_allowed(st->cfg.mirror_file_dir, "sasl.jaas.config keyTab", kt, why, len);
	free(kt);
	free(pr);
	free(svc);
	return ok;
}

/* A file:// token endpoint's file, read by kmirrord like an ssl.*.location file; false with why. */
static bool check_token_file(km_state *st, const char *url, char *why, size_t len)
{
	const char *path = km_secret_url_file(url);

	if (!path)
		return true; /* a token endpoint (the value's form is checked with the other keys') */
	return km_mirror_file_allowed(st->cfg.mirror_file_dir, "sasl.oauthbearer.token.endpoint.url", path, why, len);
}

/* The files a mirror names (ssl.*.location, a Krb5LoginModule's keyTab, a token file) must be in mirror_file_dir. */
static bool check_files(km_state *st, km_state_mut *mu)
{
	char why[512];
	for (size_t i = 0; i < mu->nkv; i++) {
		if (!mu->kv[i].value)
			continue;
		if ((!strncmp(mu->kv[i].name, "ssl.", 4) && strstr(mu->kv[i].name, ".location") &&
		     !km_mirror_file_allowed(st->cfg.mirror_file_dir, mu->kv[i].name, mu->kv[i].value, why, sizeof(why))) ||
		    (!strcmp(mu->kv[i].name, "sasl.jaas.config") && !check_keytab(st, mu->kv[i].value, why, sizeof(why))) ||
		    (!strcmp(mu->kv[i].name, "sasl.oauthbearer.token.endpoint.url") &&
		     !check_token_file(st, mu->kv[i].value, why, sizeof(why)))) {
			set_msg(mu, KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG, "%s", why);
			return false;
		}
	}
	return true;
}

/* name's value once mu is applied to m (NULL: not set, or removed by mu); a secret opened into buf. */
static const char *merged_value(const km_state *st, const km_state_mut *mu, const km_state_mirror *m, const char *name,
				char *buf, size_t len)
{
	for (size_t i = 0; i < mu->nkv; i++)
		if (!strcmp(mu->kv[i].name, name))
			return mu->kv[i].value;
	if (!m)
		return NULL;
	if (km_state_config_is_secret(name))
		return km_state_mirror_secret(st, m, name, buf, len) == KM_OK ? buf : NULL;
	for (size_t i = 0; i < m->ncfg; i++)
		if (!strcmp(m->cfg[i].name, name))
			return m->cfg[i].value;
	return NULL;
}

/*
 * When mu changes a mirror's ssl.* keys: its PEM files and stores do not both say the same thing,
 * and its stores open with their passwords (a wrong password, a JKS file or a keystore without a
 * key is refused now, not at the pipeline's first connection to the source).
 */
static bool check_stores(km_state *st, km_state_mut *mu, const km_state_mirror *m)
{
	char pw[3][1024], why[512];
	bool touched = false, ok = true;
	km_net_tls_files f;
	SSL_CTX *ctx;

	for (size_t i = 0; i < mu->nkv; i++)
		touched |= !strncmp(mu->kv[i].name, "ssl.", 4);
	if (!touched)
		return true;
	f = (km_net_tls_files){
		.truststore = {.location = merged_value(st, mu, m, "ssl.truststore.location", NULL, 0),
			       .type = merged_value(st, mu, m, "ssl.truststore.type", NULL, 0),
			       .password = merged_value(st, mu, m, "ssl.truststore.password", pw[0], sizeof(pw[0]))},
		.keystore = {.location = merged_value(st, mu, m, "ssl.keystore.location", NULL, 0),
			     .type = merged_value(st, mu, m, "ssl.keystore.type", NULL, 0),
			     .password = merged_value(st, mu, m, "ssl.keystore.password", pw[1], sizeof(pw[1])),
			     .key_password = merged_value(st, mu, m, "ssl.key.password", pw[2], sizeof(pw[2]))},
	};
	if (!km_state_config_tls_sources_ok(merged_value(st, mu, m, "ssl.ca.location", NULL, 0),
					    merged_value(st, mu, m, "ssl.certificate.location", NULL, 0),
					    f.truststore.location, f.keystore.location, why, sizeof(why))) {
		ok = false;
	} else if (f.truststore.location || f.keystore.location) {
		if (!(ctx = km_net_tls_client_ctx(&f, true, why, sizeof(why))))
			ok = false;
		SSL_CTX_free(ctx);
	}
	if (!ok)
		set_msg(mu, KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG, "%s", why);
	OPENSSL_cleanse(pw, sizeof(pw));
	return ok;
}

static bool check_secrets(km_state *st, km_state_mut *mu)
{
	for (size_t i = 0; i < mu->nkv; i++)
		if (mu->kv[i].value && km_state_config_is_secret(mu->kv[i].name) && !st->have_key) {
			set_msg(mu, KM_MIRROR_SECRET_KEY_MISSING,
				"%s is a secret and kmirrord has no key to encrypt it: set mirror_secret_key_file in "
				"kmirrord.conf (32 random bytes, or 64 hex characters) and restart",
				mu->kv[i].name);
			return false;
		}
	return true;
}

static km_err add_run_rec(km_state_mut *mu, const km_state_topic *t, int32_t index, int64_t logical, int64_t physical,
			  int64_t prev_logical_end, uint8_t flags)
{
	km_state_key k = {.type = KM_STATE_REC_RUN, .mirror = km_str_c(t->mirror->name), .topic = km_str_c(t->name),
			  .partition = index, .logical = logical};
	km_wr w;
	km_err rc = KM_OK;

	km_wr_init(&w);
	if (physical >= 0)
		rc = km_state_run_value_encode(&w, physical, prev_logical_end, flags);
	if (rc == KM_OK)
		rc = add_rec(mu, &k, physical >= 0 ? &w : NULL);
	km_wr_free(&w);
	return rc;
}

/*
 * The next write of a delete into mu->recs. Several writes, each acknowledged whole before the
 * next is built: the runs' tombstones (in chunks; each committed write removes them from the
 * maps, so the next chunk is simply the runs still there), then the partitions', then the
 * mirror's. A delete that lands in part leaves a mirror with fewer stopped topics or fewer runs,
 * never run or partition records of a mirror that is gone (they would come back if the name were
 * created again and the topic started).
 */
static void delete_records(km_state_mut *mu, km_state_mirror *m)
{
	if (mu->del_phase == DEL_RUNS) {
		size_t left = km_state_model_mirror_runs(m);
		if (left > 0 && left >= mu->del_runs_left) {
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "removing the offset map runs of mirror '%s' made no progress",
				m->name);
			return;
		}
		mu->del_runs_left = left;
		/* Bounded in records and in key bytes: all of a chunk may go to one state partition's batch. */
		size_t bytes = 0;
		for (size_t i = 0; i < m->ntopics; i++)
			for (size_t j = 0; j < m->topics[i]->nparts; j++) {
				const km_offmap *map = m->topics[i]->parts[j].map;
				for (size_t r = 0; map && r < map->n && mu->nrecs < KM_STATE_DELETE_CHUNK &&
						   bytes < KM_STATE_DELETE_BYTES;
				     r++) {
					if (add_run_rec(mu, m->topics[i], (int32_t)j, map->runs[r].logical, -1, -1, 0) != KM_OK) {
						set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
						return;
					}
					bytes += mu->recs[mu->nrecs - 1].klen;
				}
			}
		if (mu->nrecs > 0)
			return;
		mu->del_phase = DEL_PARTITIONS;
	}
	if (mu->del_phase == DEL_PARTITIONS) {
		/* Each partition's progress and writer records before its own (they apply to a partition there). */
		size_t bytes = 0;
		for (size_t i = 0; i < m->ntopics; i++)
			for (size_t j = 0; j < m->topics[i]->nparts && mu->nrecs < KM_STATE_DELETE_CHUNK &&
					   bytes < KM_STATE_DELETE_BYTES;
			     j++) {
				const km_state_part *p = &m->topics[i]->parts[j];
				if (!p->present)
					continue;
				if ((p->prog.has && add_progress_rec(mu, m->topics[i], (int32_t)j, NULL) != KM_OK) ||
				    (p->wrec.has && add_writer_rec(mu, m->topics[i], (int32_t)j, -1, NULL, -1, -1) != KM_OK) ||
				    add_partition_rec(mu, m->topics[i], (int32_t)j, NULL) != KM_OK) {
					set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
					return;
				}
				bytes += mu->recs[mu->nrecs - 1].klen * 3;
			}
		if (mu->nrecs > 0)
			return;
		mu->del_phase = DEL_MIRROR;
	}
	if (add_mirror_tombstone(mu) != KM_OK)
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
}

static void prepare_mirror(km_state *st, km_state_mut *mu)
{
	char why[512];
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
	km_state_cfg_entry *cfg;
	size_t n;

	if (mu->kind == MUT_CREATE) {
		if (!mirror_name_ok(mu->mirror, why, sizeof(why))) {
			set_msg(mu, KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG, "%s", why);
			return;
		}
		if (m) {
			set_msg(mu, KM_MIRROR_CLUSTER_MIRROR_ALREADY_EXISTS, "Cluster mirror '%s' already exists", mu->mirror);
			return;
		}
	} else if (!m) {
		set_msg(mu, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, "Cluster mirror '%s' does not exist", mu->mirror);
		return;
	}
	if (mu->kind == MUT_DELETE) {
		for (size_t i = 0; i < m->ntopics; i++) {
			km_state_topic *t = m->topics[i];
			for (size_t j = 0; j < t->nparts; j++)
				if (t->parts[j].present && t->parts[j].state != KM_MP_STOPPED) {
					set_msg(mu, KM_MIRROR_CLUSTER_MIRROR_IN_USE,
						"Cluster mirror '%s' still mirrors topic %s (partition %zu is %s): stop "
						"its topics and wait for STOPPED first",
						m->name, t->name, j, km_mp_state_name(t->parts[j].state));
					return;
				}
		}
		mu->del_phase = DEL_RUNS;
		mu->del_runs_left = SIZE_MAX;
		delete_records(mu, m);
		return;
	}
	if (km_state_config_check(mu->kv, mu->nkv, mu->kind == MUT_CREATE, why, sizeof(why)) != KM_OK) {
		set_msg(mu, KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG, "%s", why);
		return;
	}
	if (!check_files(st, mu) || !check_secrets(st, mu) || !check_stores(st, mu, mu->kind == MUT_ALTER ? m : NULL) ||
	    mu->validate_only)
		return;
	cfg = merge_cfg(st, mu, mu->kind == MUT_ALTER ? m : NULL, &n);
	if (!cfg)
		return;
	write_mirror(st, mu, mu->mirror, mu->kind == MUT_CREATE ? km_wall_ms() : m->created_ms, cfg, n);
	free_cfg(cfg, n);
}

/* ---- topics ---- */

static const char *op_valid_from(km_topic_op op)
{
	switch (op) {
	case KM_TOPIC_START: return "valid for topics not mirrored, STOPPED or FAILED";
	case KM_TOPIC_STOP: return "valid from PREPARING, MIRRORING, PAUSED or FAILED";
	case KM_TOPIC_PAUSE: return "valid from MIRRORING only";
	case KM_TOPIC_RESUME: return "valid from PAUSED only";
	default: return "";
	}
}

/* The state checks of topic i; true when it passes. */
static bool check_topic(km_state *st, km_state_mut *mu, km_state_mirror *m, size_t i)
{
	const char *name = mu->topics[i];
	km_state_topic *t = km_state_model_topic(&st->model, name, strlen(name));
	km_err code;

	if (!*name || strlen(name) > KM_STATE_MAX_NAME) {
		topic_msg(mu, i, KM_KAFKA_INVALID_REQUEST, "'%s' is not a valid topic name", name);
		return false;
	}
	if (mu->op == KM_TOPIC_START && km_state_topic_internal(st, name)) {
		/* kmirrord's producer would write source records into it: Kafka's, or kmirrord's own state. */
		topic_msg(mu, i, KM_KAFKA_INVALID_TOPIC_EXCEPTION,
			  "Topic %s is internal (a name starting with __, or kmirrord's state topic): it cannot be a "
			  "mirror topic",
			  name);
		return false;
	}
	if (t && t->mirror != m) {
		/* Even STOPPED: its records came from that mirror's source, and it still answers for them. */
		if (km_state_topic_state(t) == KM_MP_STOPPED)
			topic_msg(mu, i, KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR,
				  "Topic %s is in cluster mirror '%s' (STOPPED); delete mirror '%s' before mirroring "
				  "the topic from another mirror",
				  name, t->mirror->name, t->mirror->name);
		else
			topic_msg(mu, i, KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR,
				  "Topic %s is already in cluster mirror '%s' (%s)", name, t->mirror->name,
				  km_mp_state_name(km_state_topic_state(t)));
		return false;
	}
	if (!t) {
		if (mu->op == KM_TOPIC_START)
			return true;
		topic_msg(mu, i, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR, "Topic %s is not in cluster mirror '%s'", name,
			  m->name);
		return false;
	}
	for (size_t j = 0; j < t->nparts; j++) {
		if (!t->parts[j].present || km_topic_op_allowed(mu->op, t->parts[j].state, &code))
			continue;
		topic_msg(mu, i, code, "Cannot %s topic %s of cluster mirror '%s': partition %zu is %s (%s is %s)",
			  km_topic_op_name(mu->op), name, m->name, j, km_mp_state_name(t->parts[j].state),
			  km_topic_op_name(mu->op), op_valid_from(mu->op));
		return false;
	}
	return true;
}

/* Records moving every partition of t to op's target. */
static void move_topic(km_state_mut *mu, km_state_topic *t, size_t i)
{
	km_mp_state to = km_topic_op_target(mu->op);
	int64_t now = km_wall_ms();
	for (size_t j = 0; j < t->nparts; j++) {
		km_state_part p;
		if (!t->parts[j].present)
			continue;
		p = t->parts[j];
		p.state = to;
		p.state_change_ms = next_change_ms(&t->parts[j], now);
		if (add_partition_rec(mu, t, (int32_t)j, &p) != KM_OK)
			topic_msg(mu, i, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
	}
}

static void run_write(km_state *st, km_state_mut *mu);

static void on_topics_meta(km_state *st, km_err err, const char *message, const km_state_topic_meta *metas)
{
	km_state_mut *mu = st->head;
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
	int64_t now = km_wall_ms();
	size_t k = 0;

	if (err != KM_OK) {
		for (size_t i = 0; i < mu->ntopics; i++)
			if (mu->tpending[i])
				topic_msg(mu, i, KM_MIRROR_STATE_UNAVAILABLE, "%s", message);
		finish_head(st);
		return;
	}
	for (size_t i = 0; i < mu->ntopics; i++) {
		const km_state_topic_meta *md;
		km_state_topic tmp;
		if (!mu->tpending[i])
			continue;
		md = &metas[k++];
		if (md->error != 0 || md->partitions <= 0) {
			if (md->error == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION || md->error == 0)
				topic_msg(mu, i, KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
					  "Topic %s does not exist on the destination cluster",
					  mu->topics[i]);
			else
				topic_msg(mu, i, md->error, "Metadata of topic %s on the destination failed: %s",
					  mu->topics[i], km_err_name(md->error));
			continue;
		}
		if (md->partitions > KM_STATE_MAX_PARTITIONS) {
			topic_msg(mu, i, KM_KAFKA_INVALID_REQUEST, "Topic %s has too many partitions", mu->topics[i]);
			continue;
		}
		memset(&tmp, 0, sizeof(tmp));
		tmp.name = mu->topics[i];
		tmp.mirror = m;
		tmp.id = md->id;
		for (int32_t j = 0; j < md->partitions; j++) {
			km_state_topic *old = km_state_model_topic(&st->model, mu->topics[i], strlen(mu->topics[i]));
			const km_state_part *was = old && (size_t)j < old->nparts && old->parts[j].present ? &old->parts[j] : NULL;
			km_state_part p = fresh_part(KM_MP_PREPARING, next_change_ms(was, now), mu->by_pattern);
			/* A restart keeps what was mirrored (the pipeline resumes from there) when the topic is the same. */
			if (was && km_uuid_eq(&old->id, &md->id)) {
				p.last_mirrored_offset = was->last_mirrored_offset;
				p.last_mirrored_epoch = was->last_mirrored_epoch;
			}
			/*
			 * A start begins a new record, and a new writer: the runner's record and the writer
			 * record of the life before the stop go (docs/state.md, "The runner's record").
			 */
			if (add_partition_rec(mu, &tmp, j, &p) != KM_OK ||
			    add_runner_rec(mu, &tmp, j, &p) != KM_OK ||
			    (old && (size_t)j < old->nparts && old->parts[j].wrec.has &&
			     add_writer_rec(mu, &tmp, j, -1, NULL, -1, -1) != KM_OK))
				topic_msg(mu, i, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
		}
	}
	run_write(st, mu);
}

static void prepare_topics(km_state *st, km_state_mut *mu)
{
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
	char **pending;
	size_t np = 0;

	if (!m) {
		set_msg(mu, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, "Cluster mirror '%s' does not exist", mu->mirror);
		return;
	}
	for (size_t i = 0; i < mu->ntopics; i++) {
		if (!check_topic(st, mu, m, i))
			continue;
		if (mu->op == KM_TOPIC_START) {
			mu->tpending[i] = true;
			np++;
		} else {
			move_topic(mu, km_state_model_topic(&st->model, mu->topics[i], strlen(mu->topics[i])), i);
		}
	}
	if (!np)
		return;
	pending = calloc(np, sizeof(*pending));
	if (!pending) {
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
		return;
	}
	np = 0;
	for (size_t i = 0; i < mu->ntopics; i++)
		if (mu->tpending[i])
			pending[np++] = mu->topics[i];
	mu->code = -1; /* in progress: on_topics_meta continues */
	km_state_persist_topics(st->io, pending, np, on_topics_meta);
	free(pending);
}

static void prepare_pset(km_state *st, km_state_mut *mu)
{
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
	km_state_topic *t = m ? km_state_model_topic(&st->model, mu->topics[0], strlen(mu->topics[0])) : NULL;
	int64_t now = km_wall_ms();

	if (!m) {
		set_msg(mu, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, "Cluster mirror '%s' does not exist", mu->mirror);
		return;
	}
	if (!t || t->mirror != m) {
		set_msg(mu, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR, "Topic %s is not in cluster mirror '%s'", mu->topics[0],
			m->name);
		return;
	}
	if ((unsigned)mu->to >= KM_MP__COUNT || mu->nparts == 0) {
		set_msg(mu, KM_KAFKA_INVALID_REQUEST, "invalid partition or state");
		return;
	}
	for (size_t i = 0; i < mu->nparts; i++)
		if (mu->parts[i] < 0 || mu->parts[i] >= KM_STATE_MAX_PARTITIONS) {
			set_msg(mu, KM_KAFKA_INVALID_REQUEST, "invalid partition %d", (int)mu->parts[i]);
			return;
		}
	/*
	 * Each move must be one the data plane may make from the committed state now: the caller
	 * looked at the state when it asked, and an operator's change may have run since (a stop
	 * queued ahead of the driver's PREPARING -> MIRRORING must not be undone by it).
	 */
	for (size_t i = 0; i < mu->nparts; i++) {
		int32_t pi = mu->parts[i];
		bool known = (size_t)pi < t->nparts && t->parts[pi].present;
		km_mp_state from = known ? t->parts[pi].state : km_state_topic_state(t);
		if (!km_state_settle_allowed(from, mu->to)) {
			set_msg(mu, KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES,
				"Cannot move partition %d of topic %s of cluster mirror '%s' from %s to %s", (int)pi,
				t->name, m->name, km_mp_state_name(from), km_mp_state_name(mu->to));
			return;
		}
	}
	/*
	 * All or nothing: one write holds every partition's record. The runner's record, which an
	 * operator's change through another kmirrord (a new partition record) outdates, instead of a
	 * rewrite of the partition record, which undid it (docs/reliability.md, finding 24); the
	 * partition record too for a partition that has none yet or one of an older kmirrord.
	 */
	for (size_t i = 0; i < mu->nparts && mu->code == KM_OK; i++) {
		int32_t pi = mu->parts[i];
		bool known = (size_t)pi < t->nparts && t->parts[pi].present;
		bool rec = !known || !t->parts[pi].progress_apart;
		km_state_part p = known ? t->parts[pi] : fresh_part(mu->to, now, false);
		if (p.state != mu->to)
			p.state_change_ms = rec && known ? next_change_ms(&t->parts[pi], now) : now;
		p.state = mu->to;
		if (rec) {
			/* The settle is the partition record's own state change. */
			p.rec.state = p.state;
			p.rec.state_change_ms = p.state_change_ms;
		}
		/* Where the pipeline stands is what the settle keeps (describe, LastMirroredOffsets, a failover). */
		if (p.map && p.map->tail_logical >= 0) {
			p.last_mirrored_offset = p.map->tail_logical;
			p.last_mirrored_epoch = p.map->tail_epoch;
			if (p.map->tail_held) {
				p.has_open_txn = p.map->open_txn_logical >= 0;
				p.open_txn_offset = p.map->open_txn_logical;
			}
		}
		if (mu->error) {
			p.last_error = mu->error;
			p.last_error_ms = now;
		}
		if ((!known && add_partition_rec(mu, t, pi, &p) != KM_OK) || add_runner_rec(mu, t, pi, &p) != KM_OK)
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
	}
}

/*
 * A partition's writer, in its own record (type 5), which nothing else writes: not the partition
 * record, an operator's (a rewrite of it from this view undid a stop through another kmirrord),
 * nor the runner's progress, written from views every 200 ms (one that landed late, a former
 * owner's, put an older writer back: docs/reliability.md, finding 24).
 */
static void prepare_writer(km_state *st, km_state_mut *mu)
{
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
	km_state_topic *t = m ? km_state_model_topic(&st->model, mu->topics[0], strlen(mu->topics[0])) : NULL;
	int32_t pi = mu->parts[0];

	if (!m) {
		set_msg(mu, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, "Cluster mirror '%s' does not exist", mu->mirror);
		return;
	}
	if (!t || t->mirror != m || pi < 0 || (size_t)pi >= t->nparts || !t->parts[pi].present) {
		set_msg(mu, KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
			"Partition %d of topic %s is not in cluster mirror '%s'", (int)pi, mu->topics[0], m->name);
		return;
	}
	if (mu->writer_pid < 0 || mu->writer_start < 0) {
		set_msg(mu, KM_KAFKA_INVALID_REQUEST, "invalid writer for %s-%d", t->name, (int)pi);
		return;
	}
	/* Under the start it belongs to: a writer of an earlier start stands for nothing (part_resolve). */
	if (add_writer_rec(mu, t, pi, t->parts[pi].started_ms, &mu->writer_pid, mu->writer_epoch, mu->writer_start) !=
	    KM_OK)
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
}

/* The source topic's id: in the runner's record of every partition of the topic (those that hold it already skipped). */
static void prepare_source_id(km_state *st, km_state_mut *mu)
{
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
	km_state_topic *t = m ? km_state_model_topic(&st->model, mu->topics[0], strlen(mu->topics[0])) : NULL;

	if (!t || t->mirror != m) {
		set_msg(mu, KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION, "Topic %s is not in cluster mirror '%s'", mu->topics[0],
			mu->mirror);
		return;
	}
	for (size_t i = 0; i < t->nparts; i++) {
		km_state_part p = t->parts[i];
		if (!p.present || km_uuid_eq(&p.source_id, &mu->source_id))
			continue;
		p.source_id = mu->source_id;
		if (add_runner_rec(mu, t, (int32_t)i, &p) != KM_OK) {
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
			return;
		}
	}
}

/* The source grew: partitions [known, nparts) of the topic join in PREPARING (already there: nothing to write). */
static void prepare_grow(km_state *st, km_state_mut *mu)
{
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
	km_state_topic *t = m ? km_state_model_topic(&st->model, mu->topics[0], strlen(mu->topics[0])) : NULL;
	int64_t now = km_wall_ms();
	km_mp_state ts;

	if (!m) {
		set_msg(mu, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, "Cluster mirror '%s' does not exist", mu->mirror);
		return;
	}
	if (!t || t->mirror != m) {
		set_msg(mu, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR, "Topic %s is not in cluster mirror '%s'", mu->topics[0],
			m->name);
		return;
	}
	if (mu->nparts == 0 || mu->nparts > KM_STATE_MAX_PARTITIONS) {
		set_msg(mu, KM_KAFKA_INVALID_REQUEST, "invalid partition count %zu for topic %s", mu->nparts, t->name);
		return;
	}
	/*
	 * Only a topic being mirrored grows: new partitions of a paused or stopping topic would start
	 * mirroring against the operator's wish; the pipeline asks again once the topic runs.
	 */
	ts = km_state_topic_state(t);
	if (ts != KM_MP_PREPARING && ts != KM_MP_MIRRORING) {
		set_msg(mu, KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES,
			"Cannot add partitions to topic %s of cluster mirror '%s': it is %s (valid from PREPARING or "
			"MIRRORING)",
			t->name, m->name, km_mp_state_name(ts));
		return;
	}
	for (size_t j = 0; j < mu->nparts && mu->code == KM_OK; j++) {
		km_state_part p = fresh_part(KM_MP_PREPARING, now, km_state_topic_by_pattern(t));
		if (j < t->nparts && t->parts[j].present)
			continue;
		if (add_partition_rec(mu, t, (int32_t)j, &p) != KM_OK)
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
	}
}

/* ---- offset map runs ---- */

static void prepare_runs(km_state *st, km_state_mut *mu)
{
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);

	if (!m) {
		set_msg(mu, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR, "Cluster mirror '%s' does not exist", mu->mirror);
		return;
	}
	if (mu->nruns > KM_STATE_MAX_RUNS_WRITE) {
		set_msg(mu, KM_KAFKA_INVALID_REQUEST, "%zu runs in one write (at most %d)", mu->nruns, KM_STATE_MAX_RUNS_WRITE);
		return;
	}
	/* All or nothing: every run is checked before any record is built. */
	for (size_t i = 0; i < mu->nruns; i++) {
		const km_state_run *r = &mu->runs[i];
		km_state_topic *t = km_state_model_topic(&st->model, r->topic, strlen(r->topic));
		if (!t || t->mirror != m) {
			set_msg(mu, KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION, "Topic %s is not in cluster mirror '%s'", r->topic,
				m->name);
			return;
		}
		if (r->partition < 0 || r->partition >= KM_STATE_MAX_PARTITIONS) {
			set_msg(mu, KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION, "Partition %d of topic %s is out of range", (int)r->partition,
				r->topic);
			return;
		}
		if (r->logical < 0 || r->physical < -1 || r->prev_logical_end < -1 || r->prev_logical_end > r->logical) {
			set_msg(mu, KM_KAFKA_INVALID_REQUEST,
				"Invalid run for %s-%d: logical %lld, physical %lld, previous run's end %lld", r->topic,
				(int)r->partition, (long long)r->logical, (long long)r->physical,
				(long long)r->prev_logical_end);
			return;
		}
	}
	for (size_t i = 0; i < mu->nruns; i++) {
		const km_state_run *r = &mu->runs[i];
		km_state_topic *t = km_state_model_topic(&st->model, r->topic, strlen(r->topic));
		if (add_run_rec(mu, t, r->partition, r->logical, r->physical, r->prev_logical_end, r->flags) != KM_OK) {
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
			return;
		}
	}
}

/* Each partition's record with its last mirrored offset moved; what is gone or stopping is skipped. */
static void prepare_progress(km_state *st, km_state_mut *mu)
{
	km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);

	for (size_t i = 0; m && i < mu->nruns; i++) {
		const km_state_run *r = &mu->runs[i];
		km_state_topic *t = km_state_model_topic(&st->model, r->topic, strlen(r->topic));
		km_state_part p;
		if (!t || t->mirror != m || r->partition < 0 || (size_t)r->partition >= t->nparts ||
		    !t->parts[r->partition].present || r->logical < 0)
			continue;
		p = t->parts[r->partition];
		if (p.state == KM_MP_STOPPING || p.state == KM_MP_STOPPED ||
		    (p.last_mirrored_offset == r->logical && p.last_mirrored_epoch == r->epoch &&
		     (p.has_open_txn ? p.open_txn_offset : -1) == (r->open_txn >= 0 ? r->open_txn : -1)))
			continue;
		/*
		 * The progress alone, in its own record: the partition's record (its state above all) is
		 * the control plane's, and a view that has not seen a stop through another kmirrord yet
		 * would otherwise write it back (docs/reliability.md, finding 11).
		 */
		p.last_mirrored_offset = r->logical;
		p.last_mirrored_epoch = r->epoch;
		p.has_open_txn = r->open_txn >= 0;
		p.open_txn_offset = r->open_txn;
		if (add_runner_rec(mu, t, r->partition, &p) != KM_OK) {
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
			return;
		}
	}
}

/* ---- the write and the commit ---- */

static void log_mirror_change(const km_state_mut *mu)
{
	/* Names only: configuration values (and secrets above all) never go to the log. */
	if (mu->kind == MUT_CREATE)
		KM_INFO(COMP, 0, "mirror %s created (%zu configuration entries)", mu->mirror, mu->nkv);
	else if (mu->kind == MUT_ALTER)
		KM_INFO(COMP, 0, "mirror %s altered (%zu configuration entries changed)", mu->mirror, mu->nkv);
	else if (mu->kind == MUT_DELETE)
		KM_INFO(COMP, 0, "mirror %s deleted", mu->mirror);
}

/* The proxy asks on every Produce whether any topic is read-only: keep the answer counted. */
static void count_read_only(km_state *st)
{
	size_t n = 0;

	for (size_t i = 0; i < st->model.nmirrors; i++)
		for (size_t j = 0; j < st->model.mirrors[i]->ntopics; j++) {
			const km_state_topic *t = st->model.mirrors[i]->topics[j];
			for (size_t k = 0; k < t->nparts; k++)
				if (t->parts[k].present && t->parts[k].state != KM_MP_STOPPED) {
					n++;
					break;
				}
		}
	st->read_only_topics = n;
	km_state_counters_count(&st->ctr, &st->model);
}

uint64_t km_state_follow_ticket(const km_state *st)
{
	return st->io ? km_state_persist_follow_ticket(st->io) : 0;
}

bool km_state_follow_reached(const km_state *st, uint64_t ticket)
{
	return !st->io || km_state_persist_follow_reached(st->io, ticket);
}

bool km_state_is_store_topic_id(const km_state *st, const km_uuid *id)
{
	return st && id && !km_uuid_is_zero(&st->store_topic_id) && km_uuid_eq(&st->store_topic_id, id);
}

size_t km_state_read_only_topics(const km_state *st)
{
	return st ? st->read_only_topics : 0;
}

static void on_written(km_state *st, km_err err, const char *message)
{
	km_state_mut *mu = st->head;
	struct timeval now;

	gettimeofday(&now, NULL);
	km_state_counters_write(&st->ctr, err == KM_OK,
				(double)(now.tv_sec - st->write_start.tv_sec) + (now.tv_usec - st->write_start.tv_usec) / 1e6);
	if (err != KM_OK) {
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "Writing %s failed: %s", st->cfg.mirror_state_topic, message);
		KM_WARN(COMP, 0, "%s", mu->message);
		finish_head(st);
		return;
	}
	/*
	 * Apply every record, index the topics once, then tell the listeners: they see the whole
	 * write committed (a listener reading the store finds every topic of it).
	 */
	km_state_change *chgs = calloc(mu->nrecs ? mu->nrecs : 1, sizeof(*chgs));
	size_t nchg = 0;
	for (size_t i = 0; i < mu->nrecs; i++) {
		km_state_change chg;
		km_err rc = km_state_model_apply(&st->model, mu->recs[i].key, mu->recs[i].klen, mu->recs[i].val,
						 mu->recs[i].vlen, mu->recs[i].val == NULL, &chg);
		if (rc != KM_OK) {
			KM_ERROR(COMP, 0, "applying a written record failed: %s", km_err_name(rc));
			continue;
		}
		if (!chg.changed)
			continue;
		KM_INFO(COMP, 0, "%s/%s-%d %s -> %s", chg.mirror, chg.topic, chg.partition, km_mp_state_name(chg.from),
			km_mp_state_name(chg.to));
		/* The change's names live only until the next apply. */
		if (chgs && (chg.mirror = strdup(chg.mirror)) && (chg.topic = strdup(chg.topic))) {
			chgs[nchg++] = chg;
		} else {
			if (chgs)
				free((char *)chg.mirror);
			KM_ERROR(COMP, 0, "out of memory: %s-%d's listeners are not told", chg.topic, chg.partition);
		}
	}
	if (km_state_model_index(&st->model) != KM_OK)
		KM_ERROR(COMP, 0, "out of memory indexing topics");
	/* Every write is one mirror's (an instance's record names none): only its partitions' bounds can move. */
	{
		km_state_mirror *bm = km_state_model_mirror(&st->model, mu->mirror);
		if (bm)
			km_state_mirror_bound(bm);
	}
	count_read_only(st);
	for (size_t i = 0; i < nchg; i++) {
		if (st->on_partition)
			st->on_partition(st->arg, chgs[i].mirror, chgs[i].topic, chgs[i].partition, chgs[i].from, chgs[i].to);
		free((char *)chgs[i].mirror);
		free((char *)chgs[i].topic);
	}
	free(chgs);
	if (mu->kind == MUT_DELETE && mu->del_phase != DEL_MIRROR) {
		km_state_mirror *m = km_state_model_mirror(&st->model, mu->mirror);
		recs_clear(mu);
		if (m)
			delete_records(mu, m);
		run_write(st, mu);
		return;
	}
	log_mirror_change(mu);
	finish_head(st);
}

static void run_write(km_state *st, km_state_mut *mu)
{
	if (mu->code == -1)
		mu->code = KM_OK;
	if (mu->code != KM_OK || mu->nrecs == 0 || mu->validate_only) {
		finish_head(st);
		return;
	}
	gettimeofday(&st->write_start, NULL);
	km_state_persist_write(st->io, mu->recs, mu->nrecs, on_written);
}

/* A write of the mirror's pipeline: made only while this kmirrord runs the mirror. */
static bool owners_write(const km_state_mut *mu)
{
	return mu->kind == MUT_RUNS || mu->kind == MUT_WRITER || mu->kind == MUT_PROGRESS || mu->kind == MUT_PSET ||
	       mu->kind == MUT_SOURCE_ID || mu->kind == MUT_REWRITE;
}

/*
 * A pipeline's write whose mirror this kmirrord no longer runs, or has lost and got back since it
 * was asked for: a former life's write (docs/state.md, "Writes of a former owner").
 */
static bool owner_gone(km_state *st, const km_state_mut *mu, char *why, size_t len, const char *then)
{
	uint64_t now;

	if (!owners_write(mu) || !st->owner_term)
		return false;
	now = st->owner_term(st->owner_term_arg, mu->mirror);
	if (mu->term != 0 && now == mu->term)
		return false;
	snprintf(why, len, "this kmirrord %s mirror '%s'%s: its pipeline's write is %s",
		 now ? "has lost and taken again" : "no longer runs", mu->mirror,
		 now ? " since the write was asked for" : "", then);
	return true;
}

bool km_state_write_owner_gone(km_state *st, char *why, size_t len)
{
	const km_state_mut *mu = st->head;
	return mu && st->running && owner_gone(st, mu, why, len, "not retried");
}

static void run_head(km_state *st)
{
	km_state_mut *mu = st->head;
	char why[400];

	st->running = true;
	if (st->fatal[0]) {
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "%s", st->fatal);
		finish_head(st);
		return;
	}
	if (owner_gone(st, mu, why, sizeof(why), "dropped")) {
		set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "%s", why);
		KM_INFO(COMP, 0, "%s", mu->message);
		finish_head(st);
		return;
	}
	if (!st->ready) {
		set_msg(mu, KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS, "mirror state is loading from %s; retry",
			st->cfg.mirror_state_topic);
		finish_head(st);
		return;
	}
	switch (mu->kind) {
	case MUT_CREATE:
	case MUT_ALTER:
	case MUT_DELETE:
		prepare_mirror(st, mu);
		break;
	case MUT_TOPICS:
		prepare_topics(st, mu);
		if (mu->code == -1)
			return; /* waits for metadata */
		break;
	case MUT_PSET:
		prepare_pset(st, mu);
		break;
	case MUT_RUNS:
		prepare_runs(st, mu);
		break;
	case MUT_GROW:
		prepare_grow(st, mu);
		break;
	case MUT_WRITER:
		prepare_writer(st, mu);
		break;
	case MUT_PROGRESS:
		prepare_progress(st, mu);
		break;
	case MUT_SOURCE_ID:
		prepare_source_id(st, mu);
		break;
	case MUT_INSTANCE:
	case MUT_SYNC_GROUP: {
		km_state_key k = {.type = mu->kind == MUT_INSTANCE ? KM_STATE_REC_INSTANCE : KM_STATE_REC_SYNC_GROUP,
				  .instance = km_str_c(mu->mirror), .group = km_str_c(mu->mirror)};
		if (add_rec(mu, &k, &mu->value) != KM_OK)
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "out of memory");
		break;
	}
	case MUT_REWRITE:
		break; /* its record was taken when it was asked for */
	}
	run_write(st, mu);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	km_state *st = arg;
	(void)fd;
	(void)what;
	while (st->refusals) {
		km_state_mut *mu = st->refusals;
		st->refusals = mu->next;
		answer(mu);
	}
	if (st->head && !st->running)
		run_head(st);
	/* Last: the owner may free the store from it. */
	if (st->fatal[0] && !st->fatal_told) {
		st->fatal_told = true;
		if (st->on_fatal)
			st->on_fatal(st->arg, st->fatal);
	}
}

static void submit(km_state *st, km_state_mut *mu)
{
	if (!mu) {
		return;
	}
	mu->st = st;
	if (st->closing || !st->ready || st->queued >= KM_STATE_QUEUE_MAX) {
		if (st->closing)
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "kmirrord is shutting down");
		else if (st->fatal[0])
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "%s", st->fatal);
		else if (!st->ready)
			set_msg(mu, KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS, "mirror state is loading from %s; retry",
				st->cfg.mirror_state_topic);
		else
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "the state store is busy (%d changes queued); retry",
				KM_STATE_QUEUE_MAX);
		mu->next = st->refusals;
		st->refusals = mu;
	} else {
		mu->next = NULL;
		if (st->tail)
			st->tail->next = mu;
		else
			st->head = mu;
		st->tail = mu;
		st->queued++;
		st->submitted++;
		if (owners_write(mu) && st->owner_term)
			mu->term = st->owner_term(st->owner_term_arg, mu->mirror);
	}
	schedule(st);
}

static km_state_mut *mut_new(mut_kind kind, const char *mirror, km_state_done_cb done, void *arg)
{
	km_state_mut *mu = calloc(1, sizeof(*mu));
	if (!mu)
		return NULL;
	mu->kind = kind;
	mu->mirror = strdup(mirror ? mirror : "");
	mu->done = done;
	mu->arg = arg;
	if (!mu->mirror) {
		free(mu);
		return NULL;
	}
	return mu;
}

static void nomem(km_state_done_cb done, void *arg)
{
	km_state_result res = {.code = KM_MIRROR_STATE_UNAVAILABLE, .message = "out of memory"};
	if (done)
		done(arg, &res);
}

static km_state_mut *mut_kv(mut_kind kind, const char *name, const km_state_kv *kv, size_t n, bool vo,
			    km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(kind, name, done, arg);
	if (!mu)
		return NULL;
	mu->validate_only = vo;
	if (n && !(mu->kv = calloc(n, sizeof(*mu->kv)))) {
		mut_free(mu);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		mu->kv[i].name = strdup(kv[i].name ? kv[i].name : "");
		mu->kv[i].value = sdup(kv[i].value);
		mu->nkv++;
		if (!mu->kv[i].name || (kv[i].value && !mu->kv[i].value)) {
			mut_free(mu);
			return NULL;
		}
	}
	return mu;
}

void km_state_create_mirror(km_state *st, const char *name, const km_state_kv *kv, size_t n, bool validate_only,
			    km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_kv(MUT_CREATE, name, kv, n, validate_only, done, arg);
	if (!mu)
		return nomem(done, arg);
	submit(st, mu);
}

void km_state_alter_mirror(km_state *st, const char *name, const km_state_kv *kv, size_t n, bool validate_only,
			   km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_kv(MUT_ALTER, name, kv, n, validate_only, done, arg);
	if (!mu)
		return nomem(done, arg);
	submit(st, mu);
}

void km_state_delete_mirror(km_state *st, const char *name, km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_DELETE, name, done, arg);
	if (!mu)
		return nomem(done, arg);
	submit(st, mu);
}

static bool set_topics(km_state_mut *mu, const char *const *topics, size_t n)
{
	mu->topics = calloc(n ? n : 1, sizeof(*mu->topics));
	mu->tres = calloc(n ? n : 1, sizeof(*mu->tres));
	mu->tmsg = calloc(n ? n : 1, sizeof(*mu->tmsg));
	mu->tpending = calloc(n ? n : 1, sizeof(*mu->tpending));
	if (!mu->topics || !mu->tres || !mu->tmsg || !mu->tpending)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (!(mu->topics[i] = strdup(topics[i] ? topics[i] : "")))
			return false;
		mu->ntopics++;
	}
	return true;
}

static void topics_op(km_state *st, km_topic_op op, bool by_pattern, const char *mirror, const char *const *topics,
		      size_t n, km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_TOPICS, mirror, done, arg);
	if (!mu)
		return nomem(done, arg);
	mu->op = op;
	mu->by_pattern = by_pattern;
	if ((unsigned)op >= KM_TOPIC__COUNT || !set_topics(mu, topics, n)) {
		mut_free(mu);
		return nomem(done, arg);
	}
	submit(st, mu);
}

void km_state_topics(km_state *st, km_topic_op op, const char *mirror, const char *const *topics, size_t n,
		     km_state_done_cb done, void *arg)
{
	topics_op(st, op, false, mirror, topics, n, done, arg);
}

void km_state_topics_follow(km_state *st, const char *mirror, const char *const *topics, size_t n,
			    km_state_done_cb done, void *arg)
{
	topics_op(st, KM_TOPIC_START, true, mirror, topics, n, done, arg);
}

void km_state_partitions_set(km_state *st, const char *mirror, const char *topic, const int32_t *partitions,
			     size_t n, km_mp_state to, const char *error, km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_PSET, mirror, done, arg);
	const char *one[1] = {topic};
	if (!mu)
		return nomem(done, arg);
	mu->to = to;
	mu->error = sdup(error);
	mu->parts = malloc((n ? n : 1) * sizeof(*mu->parts));
	if (!mu->parts || (error && !mu->error) || !set_topics(mu, one, 1)) {
		mut_free(mu);
		return nomem(done, arg);
	}
	if (n)
		memcpy(mu->parts, partitions, n * sizeof(*partitions));
	mu->nparts = n;
	mu->ntopics = 1;
	submit(st, mu);
}

void km_state_partition_set(km_state *st, const char *mirror, const char *topic, int32_t partition, km_mp_state to,
			    const char *error, km_state_done_cb done, void *arg)
{
	km_state_partitions_set(st, mirror, topic, &partition, 1, to, error, done, arg);
}

void km_state_partition_writer(km_state *st, const char *mirror, const char *topic, int32_t partition, int64_t pid,
				int16_t epoch, int64_t start, km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_WRITER, mirror, done, arg);
	const char *one[1] = {topic};
	if (!mu)
		return nomem(done, arg);
	mu->parts = malloc(sizeof(*mu->parts));
	if (!mu->parts || !set_topics(mu, one, 1)) {
		mut_free(mu);
		return nomem(done, arg);
	}
	mu->parts[0] = partition;
	mu->nparts = 1;
	mu->ntopics = 1;
	mu->writer_pid = pid;
	mu->writer_epoch = epoch;
	mu->writer_start = start;
	submit(st, mu);
}

void km_state_topic_source_id_set(km_state *st, const char *mirror, const char *topic, const km_uuid *id,
				   km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_SOURCE_ID, mirror, done, arg);
	const char *one[1] = {topic};
	if (!mu)
		return nomem(done, arg);
	if (!set_topics(mu, one, 1)) {
		mut_free(mu);
		return nomem(done, arg);
	}
	mu->ntopics = 1;
	mu->source_id = *id;
	submit(st, mu);
}

void km_state_topic_add_partitions(km_state *st, const char *mirror, const char *topic, int32_t new_count,
				   km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_GROW, mirror, done, arg);
	const char *one[1] = {topic};
	if (!mu)
		return nomem(done, arg);
	if (!set_topics(mu, one, 1)) {
		mut_free(mu);
		return nomem(done, arg);
	}
	mu->nparts = new_count > 0 ? (size_t)new_count : 0;
	mu->ntopics = 1;
	submit(st, mu);
}

void km_state_runs_write(km_state *st, const char *mirror, const km_state_run *runs, size_t n, km_state_done_cb done,
			 void *arg)
{
	km_state_mut *mu = mut_new(MUT_RUNS, mirror, done, arg);
	if (!mu)
		return nomem(done, arg);
	if (n && !(mu->runs = calloc(n, sizeof(*mu->runs)))) {
		mut_free(mu);
		return nomem(done, arg);
	}
	for (size_t i = 0; i < n; i++) {
		mu->runs[i] = runs[i];
		mu->runs[i].topic = strdup(runs[i].topic ? runs[i].topic : "");
		if (!mu->runs[i].topic) {
			mut_free(mu);
			return nomem(done, arg);
		}
		mu->nruns++;
	}
	submit(st, mu);
}

void km_state_progress_write(km_state *st, const char *mirror, const km_state_progress *items, size_t n,
			     km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_PROGRESS, mirror, done, arg);
	if (!mu)
		return nomem(done, arg);
	if (n && !(mu->runs = calloc(n, sizeof(*mu->runs)))) {
		mut_free(mu);
		return nomem(done, arg);
	}
	for (size_t i = 0; i < n; i++) {
		mu->runs[i] = (km_state_run){.topic = strdup(items[i].topic ? items[i].topic : ""),
					     .partition = items[i].partition, .logical = items[i].logical,
					     .epoch = items[i].epoch, .open_txn = items[i].open_txn};
		if (!mu->runs[i].topic) {
			mut_free(mu);
			return nomem(done, arg);
		}
		mu->nruns++;
	}
	submit(st, mu);
}

void km_state_rewrite_kept(km_state *st, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	km_state_key k;
	km_state_mut *mu;
	km_state_topic *t;
	const km_state_part *p;
	km_wr w;
	km_err rc;

	if (!st->ready || !val || km_state_key_decode(key, klen, &k) != KM_OK || k.type != KM_STATE_REC_PROGRESS)
		return;
	p = km_state_model_keyed_part(&st->model, &k, &t);
	/*
	 * Settled partitions only: no runner writes their record any more. A partition being run gets
	 * its runner's next progress write, and the record kept here may be behind what its runner
	 * wrote last (read back later), which must not be written after it.
	 */
	if (!p || (p->state != KM_MP_STOPPED && p->state != KM_MP_PAUSED && p->state != KM_MP_FAILED))
		return;
	if (st->owner_term && !st->owner_term(st->owner_term_arg, t->mirror->name))
		return; /* the kmirrord that runs the mirror writes it */
	if (!(mu = mut_new(MUT_REWRITE, t->mirror->name, NULL, NULL)))
		return;
	km_wr_init(&w);
	km_wr_raw(&w, val, vlen);
	rc = add_rec(mu, &k, &w); /* the key as kmirrord writes it: the kept record's own */
	km_wr_free(&w);
	if (rc != KM_OK) {
		mut_free(mu);
		return;
	}
	KM_INFO(COMP, 0, "%s: mirror %s: the record kept is written again, so that it stays the last of its key",
		st->cfg.mirror_state_topic, t->mirror->name);
	submit(st, mu);
}

void km_state_instance_write(km_state *st, const km_state_instance *in, km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_INSTANCE, in->id, done, arg);
	if (!mu)
		return nomem(done, arg);
	km_wr_init(&mu->value);
	if (km_state_instance_value_encode(&mu->value, in) != KM_OK) {
		mut_free(mu);
		return nomem(done, arg);
	}
	submit(st, mu);
}

void km_state_sync_group_write(km_state *st, const km_state_sync_group *g, km_state_done_cb done, void *arg)
{
	km_state_mut *mu = mut_new(MUT_SYNC_GROUP, g->base, done, arg);
	if (!mu)
		return nomem(done, arg);
	km_wr_init(&mu->value);
	if (km_state_sync_group_value_encode(&mu->value, g) != KM_OK) {
		mut_free(mu);
		return nomem(done, arg);
	}
	submit(st, mu);
}

const km_state_sync_group *km_state_sync_group_of(const km_state *st, const char *base)
{
	return km_state_model_sync_group(&st->model, base);
}

const km_state_instance *km_state_instances(const km_state *st, size_t *n)
{
	*n = st->model.ninstances;
	return st->model.instances;
}

int64_t km_state_follow_delay_ms(const km_state *st)
{
	return st->ctr.follows ? st->ctr.follow_last_ms : -1;
}

void km_state_owner_check(km_state *st, uint64_t (*owner_term)(void *arg, const char *mirror), void *arg)
{
	st->owner_term = owner_term;
	st->owner_term_arg = arg;
}

uint64_t km_state_write_ticket(const km_state *st)
{
	return st->submitted;
}

bool km_state_write_reached(const km_state *st, uint64_t ticket)
{
	return st->finished >= ticket;
}

void km_state_on_tail(km_state *st, km_state_tail_cb cb, void *arg)
{
	st->on_tail = cb;
	st->tail_arg = arg;
}

void km_state_tail_moved(km_state *st, const km_offmap *map)
{
	if (st->on_tail)
		st->on_tail(st->tail_arg, map);
}

void km_state_offmap_release(km_state *st, const char *topic, int32_t partition)
{
	km_state_topic *t = km_state_model_topic(&st->model, topic, strlen(topic));
	if (!t || partition < 0 || (size_t)partition >= t->nparts || !t->parts[partition].map)
		return;
	t->parts[partition].map->tail_held = false;
	km_state_part_bound(&t->parts[partition]);
}

/* ---- life ---- */

/*
 * A reread (after a failed write, part of which may have landed) or a followed change tells the
 * listeners what it changed, as a committed write does: a partition left PREPARING or STOPPING by
 * it would otherwise wait for the next start-up to be settled.
 */
static void notify_reload(km_state *st, const km_state_model *old, const char *how)
{
	km_state_change *d = NULL;
	size_t n = 0;

	/* Out of memory part way: the changes found are still told. */
	(void)km_state_model_diff(&st->model, old, &d, &n);
	for (size_t i = 0; i < n; i++) {
		KM_INFO(COMP, 0, "%s/%s-%d %s -> %s (%s)", d[i].mirror, d[i].topic, d[i].partition,
			km_mp_state_name(d[i].from), km_mp_state_name(d[i].to), how);
		if (st->on_partition)
			st->on_partition(st->arg, d[i].mirror, d[i].topic, d[i].partition, d[i].from, d[i].to);
	}
	km_state_changes_free(d, n);
}

/* The model read (a load) or followed becomes the store's; the listeners are told what changed. */
static void take_model(km_state *st, km_state_model *model, const char *how)
{
	km_state_model old = st->model;

	st->model = *model;
	st->model_epoch++;
	km_state_model_init(model);
	count_read_only(st);
	schedule(st);
	if (st->ready_fired)
		km_state_model_carry(&st->model, &old);
	km_state_model_bound(&st->model);
	if (!st->ready_fired) {
		st->ready_fired = true;
		km_state_model_free(&old);
		if (st->on_ready)
			st->on_ready(st->arg);
		return;
	}
	notify_reload(st, &old, how);
	km_state_model_free(&old);
}

void km_state_loaded(km_state *st, km_state_model *model)
{
	size_t topics = 0;
	bool again;

	if (st->fatal[0]) {
		/* Stopped for good: what was read is not served. */
		km_state_model_free(model);
		km_state_model_init(model);
		return;
	}
	for (size_t i = 0; i < model->nmirrors; i++)
		topics += model->mirrors[i]->ntopics;
	KM_INFO(COMP, 0, "state loaded from %s: %zu mirrors, %zu topics", st->cfg.mirror_state_topic, model->nmirrors,
		topics);
	again = st->ready_fired;
	st->ready = true;
	st->ctr.ready = 1;
	take_model(st, model, "read back");
	/* Not ready since the failed write: what waited for the store goes on (on_ready fired at start). */
	if (again && st->on_reread)
		st->on_reread(st->arg);
}

void km_state_followed(km_state *st, km_state_model *model, double delay_s)
{
	if (st->fatal[0] || !st->ready) {
		km_state_model_free(model);
		km_state_model_init(model);
		return;
	}
	km_state_counters_follow(&st->ctr, delay_s);
	take_model(st, model, "followed");
}

void km_state_fatal(km_state *st, const char *message)
{
	if (st->fatal[0])
		return;
	snprintf(st->fatal, sizeof(st->fatal), "%s", message);
	KM_ERROR(COMP, 0, "%s", st->fatal);
	st->ready = false;
	st->ctr.ready = 0;
	schedule(st);
}

km_state *km_state_new(const km_state_opts *opts, char *err, size_t errlen)
{
	km_state *st = calloc(1, sizeof(*st));

	if (!st) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	st->base = opts->base;
	st->dns = opts->dns;
	st->tls = opts->tls;
	st->metrics = opts->metrics;
	st->on_ready = opts->on_ready;
	st->on_reread = opts->on_reread;
	st->on_partition = opts->on_partition;
	st->on_fatal = opts->on_fatal;
	st->arg = opts->arg;
	km_state_model_init(&st->model);
	if (km_config_copy(&st->cfg, opts->cfg) != KM_OK) {
		free(st);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (!st->cfg.mirror_state_topic || st->cfg.upstream_count < 1) {
		snprintf(err, errlen, "the state store needs upstream and mirror_state_topic");
		km_state_free(st);
		return NULL;
	}
	if (st->cfg.mirror_secret_key_file) {
		bool loose;
		if (km_state_key_load(st->cfg.mirror_secret_key_file, st->cfg.secret_file_mode_check, st->key, &loose,
				      err, errlen) != KM_OK) {
			km_state_free(st);
			return NULL;
		}
		st->have_key = true;
		if (loose)
			KM_WARN(COMP, 0, "%s", err);
	}
	st->kick = event_new(st->base, -1, 0, on_kick, st);
	st->io = km_state_persist_new(st);
	if (!st->kick || !st->io) {
		snprintf(err, errlen, "out of memory");
		km_state_free(st);
		return NULL;
	}
	/* Last: the registry keeps pointers into st, which must not be freed on a failure after it. */
	if (st->metrics && km_state_counters_register(&st->ctr, st->metrics) != KM_OK)
		KM_WARN(COMP, 0, "the state store's metrics could not be registered (out of memory, or a second store)");
	km_state_persist_load(st->io);
	return st;
}

void km_state_free(km_state *st)
{
	if (!st)
		return;
	if (st->io)
		km_state_persist_free(st->io);
	st->io = NULL;
	/*
	 * Pending mutations are answered: their callers may hold resources waiting for it. A caller
	 * may ask again from its callback (a mirror.name request goes on to its next topic): that
	 * goes to the refusals, drained here too, never to a queue nobody runs any more.
	 */
	st->closing = true;
	while (st->refusals || st->head) {
		km_state_mut *mu;
		if (st->head) {
			mu = st->head;
			st->head = mu->next;
			if (!st->head)
				st->tail = NULL;
			set_msg(mu, KM_MIRROR_STATE_UNAVAILABLE, "kmirrord is shutting down");
		} else {
			mu = st->refusals;
			st->refusals = mu->next;
		}
		answer(mu);
	}
	if (st->kick)
		event_free(st->kick);
	km_state_model_free(&st->model);
	km_config_free(&st->cfg);
	OPENSSL_cleanse(st->key, sizeof(st->key));
	free(st);
}

bool km_state_ready(const km_state *st)
{
	return st && st->ready;
}

const char *km_state_fatal_message(const km_state *st)
{
	return st && st->fatal[0] ? st->fatal : NULL;
}
