/* A mirror's configuration: which keys exist, which hold secrets, the mirror.* option table, and the checks. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/options.h"
#include "kmirror/secret.h"
#include "state/state_int.h"

#define OFF(f) offsetof(km_mirror_options, f)
#define I64MAX INT64_MAX

static const km_option mirror_options[] = {
	{.name = "mirror.metadata.refresh.interval.ms", .type = KM_OPT_INT, .offset = OFF(metadata_refresh_interval_ms),
	 .def = "30000", .min = 1000, .max = I64MAX, .reloadable = true,
	 .doc = "How often the mirror reads the source's metadata (new topics, partitions, leaders)."},
	{.name = "mirror.groups.include", .type = KM_OPT_STRING, .offset = OFF(groups_include), .def = ".*",
	 .reloadable = true,
	 .doc = "Consumer groups whose committed offsets the metadata sync copies (comma-separated POSIX extended "
		"regexes, each matching the whole name); empty: none (the offset sync is off)."},
	{.name = "mirror.groups.exclude", .type = KM_OPT_STRING, .offset = OFF(groups_exclude), .def = "",
	 .reloadable = true,
	 .doc = "Consumer groups never synced (comma-separated POSIX extended regexes, whole name); exclude wins over "
		"include."},
	{.name = "mirror.acl.include", .type = KM_OPT_STRING, .offset = OFF(acl_include), .def = "",
	 .reloadable = true,
	 .doc = "ACL bindings the metadata sync keeps equal to the source's: rules "
		"`resourceType;resourceName;operation;permissionType;principal` separated by commas (docs/mirror.md, "
		"\"Metadata sync\"); empty (the default): none, the ACL sync is off. Inside the scope, bindings the "
		"source does not have are deleted from the destination: `*` makes the destination's ACLs exactly the "
		"source's."},
	{.name = "mirror.fetch.max.bytes", .type = KM_OPT_INT, .offset = OFF(fetch_max_bytes), .def = "52428800",
	 .min = 1024, .max = INT32_MAX, .reloadable = true,
	 .doc = "MaxBytes of the mirror's Fetch requests to the source."},
	{.name = "mirror.fetch.partition.max.bytes", .type = KM_OPT_INT, .offset = OFF(fetch_partition_max_bytes),
	 .def = "10485760", .min = 1024, .max = INT32_MAX, .reloadable = true,
	 .doc = "PartitionMaxBytes of the mirror's Fetch requests to the source."},
	{.name = "mirror.fetch.sessions", .type = KM_OPT_BOOL, .offset = OFF(fetch_sessions), .def = "true",
	 .reloadable = true,
	 .doc = "Incremental fetch sessions (KIP-227) with each source broker from Kafka 1.1 on: a Fetch names only "
		"the partitions that changed; a broker that leads more than 1,000 of the mirror's partitions has a "
		"session per group of 1,000, on a connection each. false: every Fetch names every partition (less "
		"work for a source broker that leads many of them, a little more lag)."},
	{.name = "mirror.replication.throttled.rate", .type = KM_OPT_INT, .offset = OFF(throttle_bytes_per_sec),
	 .def = "0", .min = 0, .max = I64MAX, .reloadable = true,
	 .doc = "Bytes per second the mirror fetches from the source at most, all its topics together; 0: unlimited."},
	{.name = "mirror.start.offset", .type = KM_OPT_STRING, .offset = OFF(start_offset), .def = "earliest",
	 .reloadable = true,
	 .doc = "Where a partition started with nothing mirrored yet begins: `earliest`, `latest`, or a timestamp "
		"(ms since the epoch: the first record at or after it)."},
	{.name = "mirror.support.unclean.leader.election", .type = KM_OPT_BOOL, .offset = OFF(unclean_hide),
	 .def = "false", .reloadable = true,
	 .doc = "When the source's log diverges from what was mirrored (an unclean leader election there, or a "
		"truncation below the mirrored offset): false, the partition goes FAILED naming the divergent records; "
		"true, those records are hidden and the partition mirrors on from the source's new log (docs/mirror.md, "
		"\"A diverged source\")."},
	{.name = "mirror.topics.include", .type = KM_OPT_STRING, .offset = OFF(topics_include), .def = "",
	 .reloadable = true,
	 .doc = "Source topics the mirror starts by itself when they appear, checked every "
		"mirror.metadata.refresh.interval.ms (comma-separated POSIX extended regexes, each matching the whole "
		"name; names starting with __ never); empty: none (docs/mirror.md, \"Metadata sync\")."},
	{.name = "mirror.topics.exclude", .type = KM_OPT_STRING, .offset = OFF(topics_exclude), .def = "",
	 .reloadable = true,
	 .doc = "Source topics never started by mirror.topics.include (comma-separated POSIX extended regexes, whole "
		"name); exclude wins over include."},
};

static const km_opt_table mirror_table = {mirror_options, sizeof(mirror_options) / sizeof(mirror_options[0]),
					  sizeof(km_mirror_options)};

const km_opt_table *km_state_mirror_option_table(void)
{
	return &mirror_table;
}

/* The list lives in src/core: the kmirror CLI, which knows no state store, warns on the same keys. */
bool km_state_config_is_secret(const char *name)
{
	return km_secret_config_key(name);
}

static const char *const protocols[] = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"};
static const char *const mechanisms[] = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"};
static const char *const ident_algos[] = {"https", ""};
static const char *const store_types[] = {"PKCS12", "PEM", "JKS"};

typedef enum { V_ANY, V_BOOTSTRAP, V_CHOICE, V_TOKEN_URL } value_kind;

/* The source connection properties kmirror accepts (the Kafka client names). */
static const struct {
	const char *name;
	value_kind kind;
	const char *const *choices;
	size_t nchoices;
} conn_keys[] = {
	{"bootstrap.servers", V_BOOTSTRAP, NULL, 0},
	{"security.protocol", V_CHOICE, protocols, 4},
	{"sasl.mechanism", V_CHOICE, mechanisms, 5},
	{"sasl.kerberos.service.name", V_ANY, NULL, 0},
	{"sasl.oauthbearer.token.endpoint.url", V_TOKEN_URL, NULL, 0},
	/* Kafka 4.1's names for the client credentials (KIP-1139): over the JAAS line's clientId, clientSecret, scope */
	{"sasl.oauthbearer.client.credentials.client.id", V_ANY, NULL, 0},
	{"sasl.oauthbearer.client.credentials.client.secret", V_ANY, NULL, 0},
	{"sasl.oauthbearer.scope", V_ANY, NULL, 0},
	{"sasl.username", V_ANY, NULL, 0},
	{"sasl.password", V_ANY, NULL, 0},
	{"sasl.jaas.config", V_ANY, NULL, 0},
	{"ssl.ca.location", V_ANY, NULL, 0},
	{"ssl.certificate.location", V_ANY, NULL, 0},
	{"ssl.key.location", V_ANY, NULL, 0},
	{"ssl.key.password", V_ANY, NULL, 0},
	{"ssl.truststore.location", V_ANY, NULL, 0},
	{"ssl.truststore.type", V_CHOICE, store_types, 3},
	{"ssl.truststore.password", V_ANY, NULL, 0},
	{"ssl.keystore.location", V_ANY, NULL, 0},
	{"ssl.keystore.type", V_CHOICE, store_types, 3},
	{"ssl.keystore.password", V_ANY, NULL, 0},
	{"ssl.endpoint.identification.algorithm", V_CHOICE, ident_algos, 2},
	{"client.id", V_ANY, NULL, 0},
};

static bool check_bootstrap(const char *v, char *why, size_t len)
{
	const char *p = v;
	int n = 0;

	while (*p) {
		const char *comma = strchr(p, ',');
		size_t l = comma ? (size_t)(comma - p) : strlen(p);
		char one[300];
		km_hostport hp;

		while (l && *p == ' ')
			p++, l--;
		while (l && p[l - 1] == ' ')
			l--;
		if (l == 0 || l >= sizeof(one)) {
			snprintf(why, len, "an empty or over-long entry");
			return false;
		}
		memcpy(one, p, l);
		one[l] = 0;
		if (!km_hostport_parse(one, &hp) || hp.port == 0 || !hp.host[0]) {
			snprintf(why, len, "'%.200s' is not host:port (%s, the port not 0)", one, KM_HOSTPORT_SYNTAX);
			return false;
		}
		n++;
		p = comma ? comma + 1 : p + strlen(p);
	}
	if (n == 0) {
		snprintf(why, len, "no host:port given");
		return false;
	}
	return true;
}

/* One side of the groups filter, the other side as the default (an AlterMirror may change just one). */
static bool check_names(bool include, const char *v, char *why, size_t len)
{
	km_name_filter *f = include ? km_name_filter_parse(v, NULL, why, len) : km_name_filter_parse(".*", v, why, len);
	bool ok = f != NULL;

	km_name_filter_free(f);
	return ok;
}

static bool check_acl_scope(const char *v, char *why, size_t len)
{
	km_acl_scope *s = km_acl_scope_parse(v, why, len);
	bool ok = s != NULL;

	km_acl_scope_free(s);
	return ok;
}

/* earliest, latest, or a timestamp in ms (digits only). */
static bool check_start_offset(const char *v, char *why, size_t len)
{
	size_t n = strspn(v, "0123456789");
	if (!strcmp(v, "earliest") || !strcmp(v, "latest") || (n > 0 && n < 19 && v[n] == 0))
		return true;
	snprintf(why, len, "'%s' is not earliest, latest or a timestamp in ms", v);
	return false;
}

/* One entry; false with why set when refused. */
static bool check_one(const km_state_kv *kv, bool create, km_mirror_options *mo, char *why, size_t len)
{
	if (!kv->name || !*kv->name) {
		snprintf(why, len, "empty key");
		return false;
	}
	if (kv->value && strlen(kv->value) > KM_STATE_MAX_VALUE) {
		snprintf(why, len, "value longer than %d bytes", KM_STATE_MAX_VALUE);
		return false;
	}
	if (!strncmp(kv->name, "mirror.", 7)) {
		const km_option *o = km_opt_find(&mirror_table, kv->name);
		if (!o) {
			snprintf(why, len, "unknown mirror option");
			return false;
		}
		if (!kv->value) {
			if (create) {
				snprintf(why, len, "no value");
				return false;
			}
			return true;
		}
		if (km_opt_set_row(o, mo, kv->value, why, len) != KM_OK)
			return false;
		if ((o->offset == OFF(groups_include) || o->offset == OFF(groups_exclude)) &&
		    !check_names(o->offset == OFF(groups_include), kv->value, why, len))
			return false;
		if ((o->offset == OFF(topics_include) || o->offset == OFF(topics_exclude)) &&
		    !check_names(o->offset == OFF(topics_include), kv->value, why, len))
			return false;
		if (o->offset == OFF(acl_include) && !check_acl_scope(kv->value, why, len))
			return false;
		if (o->offset == OFF(start_offset) && !check_start_offset(kv->value, why, len))
			return false;
		return true;
	}
	for (size_t i = 0; i < sizeof(conn_keys) / sizeof(conn_keys[0]); i++) {
		if (strcmp(kv->name, conn_keys[i].name))
			continue;
		if (!kv->value) {
			if (create) {
				snprintf(why, len, "no value");
				return false;
			}
			if (conn_keys[i].kind == V_BOOTSTRAP) {
				snprintf(why, len, "cannot be removed");
				return false;
			}
			return true;
		}
		switch (conn_keys[i].kind) {
		case V_BOOTSTRAP:
			return check_bootstrap(kv->value, why, len);
		case V_CHOICE:
			for (size_t c = 0; c < conn_keys[i].nchoices; c++)
				if (!strcmp(kv->value, conn_keys[i].choices[c]))
					return true;
			{
				size_t off = (size_t)snprintf(why, len, "'%s' is not one of", kv->value);
				for (size_t c = 0; c < conn_keys[i].nchoices && off < len; c++)
					off += (size_t)snprintf(why + off, len - off, "%s %s", c ? "," : "",
								*conn_keys[i].choices[c] ? conn_keys[i].choices[c]
											 : "(empty)");
			}
			return false;
		case V_ANY:
			return true;
		case V_TOKEN_URL:
			if (km_secret_url_file(kv->value) || !strncmp(kv->value, "http://", 7) ||
			    !strncmp(kv->value, "https://", 8))
				return true;
			snprintf(why, len, "'%.200s' is not file:///PATH (a file in mirror_file_dir holding the token) or "
				 "an http(s) token endpoint", kv->value);
			return false;
		}
	}
	if (!strcmp(kv->name, "sasl.oauthbearer.token.command")) {
		/* kmirrord.conf's upstream_sasl_oauthbearer_token_command has no mirror counterpart, by design. */
		snprintf(why, len, "a mirror's configuration cannot run a command on kmirrord's host (clients of kmirrord "
				   "write it): have an agent write the token to a file inside mirror_file_dir and set "
				   "sasl.oauthbearer.token.endpoint.url=file:///PATH, or use a token endpoint");
		return false;
	}
	snprintf(why, len, "unknown configuration key (accepted: bootstrap.servers, security.protocol, sasl.*, ssl.*, "
			   "client.id, mirror.*)");
	return false;
}

bool km_state_config_tls_sources_ok(const char *ca, const char *cert, const char *truststore, const char *keystore,
				    char *why, size_t len)
{
	if (ca && truststore) {
		snprintf(why, len, "ssl.ca.location and ssl.truststore.location both say which CAs to trust: keep one");
		return false;
	}
	if (cert && keystore) {
		snprintf(why, len, "ssl.certificate.location and ssl.keystore.location are both the client's "
			 "certificate: keep one");
		return false;
	}
	return true;
}

/* The value kv gives name (NULL: not given, or removed). */
static const char *kv_value(const km_state_kv *kv, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (kv[i].name && !strcmp(kv[i].name, name))
			return kv[i].value;
	return NULL;
}

km_err km_state_config_check(const km_state_kv *kv, size_t n, bool create, char *err, size_t errlen)
{
	km_mirror_options mo;
	bool have_bootstrap = false;
	km_err rc = KM_OK;
	char why[512];

	if (n > KM_STATE_MAX_CONFIGS) {
		snprintf(err, errlen, "too many configuration entries (%zu, at most %d)", n, KM_STATE_MAX_CONFIGS);
		return KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG;
	}
	if (km_opt_init(&mirror_table, &mo) != KM_OK) {
		snprintf(err, errlen, "out of memory");
		return KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG;
	}
	for (size_t i = 0; i < n && rc == KM_OK; i++) {
		for (size_t j = 0; j < i; j++)
			if (kv[j].name && kv[i].name && !strcmp(kv[j].name, kv[i].name)) {
				snprintf(err, errlen, "configuration key %s given twice", kv[i].name);
				rc = KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG;
			}
		if (rc != KM_OK)
			break;
		why[0] = 0;
		if (!check_one(&kv[i], create, &mo, why, sizeof(why))) {
			/* Never echo a secret's value back: the reason names the key only. */
			snprintf(err, errlen, "invalid configuration %s: %s", kv[i].name ? kv[i].name : "(null)", why);
			rc = KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG;
		}
		if (kv[i].name && !strcmp(kv[i].name, "bootstrap.servers"))
			have_bootstrap = true;
	}
	if (rc == KM_OK && !km_state_config_tls_sources_ok(kv_value(kv, n, "ssl.ca.location"),
							  kv_value(kv, n, "ssl.certificate.location"),
							  kv_value(kv, n, "ssl.truststore.location"),
							  kv_value(kv, n, "ssl.keystore.location"), why, sizeof(why))) {
		snprintf(err, errlen, "invalid configuration: %s", why);
		rc = KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG;
	}
	if (rc == KM_OK && create && !have_bootstrap) {
		snprintf(err, errlen, "invalid configuration: bootstrap.servers (the source cluster) is required");
		rc = KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG;
	}
	km_opt_free(&mirror_table, &mo);
	return rc;
}

km_err km_state_mirror_options(const km_state_mirror *m, km_mirror_options *out)
{
	char why[256];
	km_err rc = km_opt_init(&mirror_table, out);

	if (rc != KM_OK)
		return rc;
	for (size_t i = 0; i < m->ncfg; i++) {
		const km_option *o = km_opt_find(&mirror_table, m->cfg[i].name);
		/* Values were checked when stored; one that no longer parses keeps the default. */
		if (o && m->cfg[i].value && km_opt_set_row(o, out, m->cfg[i].value, why, sizeof(why)) != KM_OK)
			continue;
	}
	return KM_OK;
}
