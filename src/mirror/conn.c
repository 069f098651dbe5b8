/* The connections a mirror makes: its source (from the mirror's configuration, secrets decrypted only here) and the destination. */
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "kmirror/secret.h"
#include "mirror_int.h"

/* A plain configuration value of m; "" for a secret (read those with km_state_mirror_secret). */
static const char *cfg_get(const km_state_mirror *m, const char *name)
{
	for (size_t i = 0; i < km_state_mirror_config_count(m); i++) {
		const char *n, *v;
		bool secret;
		km_state_mirror_config_at(m, i, &n, &v, &secret);
		if (!strcmp(n, name))
			return secret ? "" : v;
	}
	return NULL;
}

/* username="..." and password="..." out of a JAAS line. */
static bool jaas_field(const char *jaas, const char *key, char *out, size_t len)
{
	const char *p = jaas;
	size_t kl = strlen(key);
	while ((p = strstr(p, key))) {
		const char *q = p + kl;
		while (*q == ' ')
			q++;
		if (*q == '=') {
			size_t n = 0;
			q++;
			while (*q == ' ')
				q++;
			if (*q == '"') {
				q++;
				while (q[n] && q[n] != '"')
					n++;
			} else {
				while (q[n] && q[n] != ' ' && q[n] != ';')
					n++;
			}
			if (n >= len)
				return false;
			memcpy(out, q, n);
			out[n] = 0;
			return true;
		}
		p += kl;
	}
	return false;
}

/* Why a stored secret cannot be used (the store logged the details, naming the mirror). */
static void secret_why(km_err rc, const char *name, size_t cap, char *why, size_t whylen)
{
	if (rc == KM_ERR_TOO_LARGE)
		snprintf(why, whylen, "%s is longer than %zu bytes", name, cap - 1);
	else if (rc == KM_ERR_CONFIG)
		snprintf(why, whylen, "%s is sealed and kmirrord has no mirror_secret_key_file", name);
	else
		snprintf(why, whylen, "%s does not open for this mirror (sealed for another mirror or key, under another "
			 "mirror_secret_key_file, or changed): set it again with kmirror alter", name);
}

/*
 * The source's SASL password (sasl.password, else the JAAS line's) and, when sasl.username is not
 * set, the JAAS line's user into ubuf. false with why when a stored secret cannot be used: a
 * connection without the password would only fail later, and less clearly.
 */
static bool source_credentials(km_state *st, const km_state_mirror *m, const char **user, char *ubuf, size_t ulen,
			       char *pass, size_t passlen, char *why, size_t whylen)
{
	char jaas[2048] = "";
	km_err rc = km_state_mirror_secret(st, m, "sasl.password", pass, passlen);
	bool ok = true;

	if (rc != KM_OK) {
		pass[0] = 0;
		if (rc != KM_ERR_INVAL) {
			secret_why(rc, "sasl.password", passlen, why, whylen);
			return false;
		}
	}
	rc = km_state_mirror_secret(st, m, "sasl.jaas.config", jaas, sizeof(jaas));
	if (rc == KM_OK) {
		if (!*user && jaas_field(jaas, "username", ubuf, ulen))
			*user = ubuf;
		if (!pass[0] && !jaas_field(jaas, "password", pass, passlen))
			pass[0] = 0;
	} else if (rc != KM_ERR_INVAL) {
		secret_why(rc, "sasl.jaas.config", sizeof(jaas), why, whylen);
		ok = false;
	}
	OPENSSL_cleanse(jaas, sizeof(jaas));
	return ok;
}

/*
 * GSSAPI from the mirror's sasl.jaas.config (Krb5LoginModule with useKeyTab, the keytab inside
 * mirror_file_dir) and sasl.kerberos.service.name into o; the strings into kt, pr, svc (the
 * caller frees them). false with why. The default credentials cache is kmirrord's own: a mirror
 * may not borrow it.
 */
static bool source_kerberos(km_mirror *mi, const km_state_mirror *m, km_net_client_opts *o, char **kt, char **pr,
			    char **svc, char *why, size_t whylen)
{
	km_state *st = km_mirror_store(mi);
	const char *svc_cfg = cfg_get(m, "sasl.kerberos.service.name");
	char jaas[2048] = "", err[400];
	km_err rc = km_state_mirror_secret(st, m, "sasl.jaas.config", jaas, sizeof(jaas));
	km_sasl_krb5 k;
	bool ok = false;

	*kt = *pr = *svc = NULL;
	if (rc == KM_ERR_INVAL) {
		snprintf(why, whylen, "sasl.mechanism GSSAPI needs sasl.jaas.config: "
			 "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true keyTab=\"FILE\" "
			 "principal=\"NAME@REALM\";");
		return false;
	}
	if (rc != KM_OK) {
		secret_why(rc, "sasl.jaas.config", sizeof(jaas), why, whylen);
		return false;
	}
	if (km_sasl_krb5_jaas(jaas, kt, pr, svc, err, sizeof(err)) != KM_OK) {
		snprintf(why, whylen, "%s", err);
		goto out;
	}
	if (!*kt) {
		snprintf(why, whylen, "sasl.jaas.config: a mirror's Kerberos identity is a keytab (useKeyTab=true "
			 "keyTab=\"FILE\" principal=\"NAME@REALM\"), never kmirrord's own ticket cache");
		goto out;
	}
	if (!km_mirror_file_allowed(km_mirror_get_opts(mi)->cfg->mirror_file_dir, "sasl.jaas.config keyTab", *kt, why,
				    whylen))
		goto out;
	if (svc_cfg && *svc_cfg) {
		free(*svc);
		*svc = strdup(svc_cfg);
	}
	k = (km_sasl_krb5){*svc, *kt, *pr, "the mirror's sasl.jaas.config"};
	if (km_sasl_krb5_check(&k, why, whylen) != KM_OK)
		goto out;
	o->sasl_kerberos_service_name = *svc;
	o->sasl_kerberos_keytab = *kt;
	o->sasl_kerberos_principal = *pr;
	o->sasl_kerberos_setting = "the mirror's sasl.jaas.config";
	ok = true;
out:
	OPENSSL_cleanse(jaas, sizeof(jaas));
	return ok;
}

/*
 * The source's TLS context from the mirror's ssl.* keys: PEM files (ssl.ca.location,
 * ssl.certificate.location, ssl.key.location) or Kafka's stores (ssl.truststore.*,
 * ssl.keystore.*), their passwords opened here only. NULL with why.
 */
static SSL_CTX *source_tls(km_mirror *mi, const km_state_mirror *m, char *why, size_t whylen)
{
	static const char *const files[] = {"ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
					    "ssl.truststore.location", "ssl.keystore.location"};
	static const char *const secrets[] = {"ssl.truststore.password", "ssl.keystore.password", "ssl.key.password"};
	char pw[3][1024], err[512];
	bool given[3] = {false, false, false};
	SSL_CTX *ctx = NULL;
	km_net_tls_files f;

	/* Checked again where they are read: a value stored before the check, or a link changed since. */
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		if (cfg_get(m, files[i]) &&
		    !km_mirror_file_allowed(km_mirror_get_opts(mi)->cfg->mirror_file_dir, files[i], cfg_get(m, files[i]),
					    why, whylen))
			return NULL;
	for (size_t i = 0; i < 3; i++) {
		km_err rc = km_state_mirror_secret(km_mirror_store(mi), m, secrets[i], pw[i], sizeof(pw[i]));
		given[i] = rc == KM_OK;
		if (rc != KM_OK && rc != KM_ERR_INVAL) {
			secret_why(rc, secrets[i], sizeof(pw[i]), why, whylen);
			goto out;
		}
	}
	f = (km_net_tls_files){
		.ca_file = cfg_get(m, "ssl.ca.location"),
		.cert_file = cfg_get(m, "ssl.certificate.location"),
		.key_file = cfg_get(m, "ssl.key.location"),
		.truststore = {.location = cfg_get(m, "ssl.truststore.location"),
			       .type = cfg_get(m, "ssl.truststore.type"),
			       .password = given[0] ? pw[0] : NULL},
		.keystore = {.location = cfg_get(m, "ssl.keystore.location"),
			     .type = cfg_get(m, "ssl.keystore.type"),
			     .password = given[1] ? pw[1] : NULL,
			     .key_password = given[2] ? pw[2] : NULL},
	};
	if (!km_state_config_tls_sources_ok(f.ca_file, f.cert_file, f.truststore.location, f.keystore.location, why,
					    whylen))
		goto out;
	if (!(ctx = km_net_tls_client_ctx(&f, true, err, sizeof(err))))
		snprintf(why, whylen, "source TLS: %s", err);
out:
	OPENSSL_cleanse(pw, sizeof(pw));
	return ctx;
}

/*
 * Kafka 4.1's property for one of the client credentials (KIP-1139), which wins over the JAAS
 * line's: into *field (the JAAS line's value wiped and freed). False with why when a sealed one
 * cannot be read.
 */
static bool oauth_prop(km_mirror *mi, const km_state_mirror *m, const char *name, char **field, char *why,
		       size_t whylen)
{
	char buf[1024];
	const char *v = NULL;
	km_err rc;

	if (km_secret_config_key(name)) {
		rc = km_state_mirror_secret(km_mirror_store(mi), m, name, buf, sizeof(buf));
		if (rc == KM_ERR_INVAL)
			return true; /* not set */
		if (rc != KM_OK) {
			secret_why(rc, name, sizeof(buf), why, whylen);
			return false;
		}
		v = buf;
	} else if (!(v = cfg_get(m, name))) {
		return true;
	}
	if (*field) {
		OPENSSL_cleanse(*field, strlen(*field));
		free(*field);
	}
	*field = strdup(v);
	OPENSSL_cleanse(buf, sizeof(buf));
	if (!*field)
		snprintf(why, whylen, "out of memory");
	return *field != NULL;
}

/*
 * OAUTHBEARER from the mirror's sasl.oauthbearer.token.endpoint.url into o: a file:///PATH inside
 * mirror_file_dir, or an http(s) token endpoint with the client credentials of the mirror's
 * sasl.jaas.config (OAuthBearerLoginModule's clientId, clientSecret, scope) or of Kafka 4.1's
 * sasl.oauthbearer.client.credentials.client.id, .client.secret and sasl.oauthbearer.scope, which
 * win: into id, secret and scope, which the caller wipes and frees. false with why (no URL, a file
 * outside the directory, no live token in it, an endpoint without a client, a JAAS line of another
 * login module).
 */
static bool source_oauth(km_mirror *mi, const km_state_mirror *m, km_net_client_opts *o, char **id, char **secret,
			 char **scope, char *why, size_t whylen)
{
	const char *url = cfg_get(m, "sasl.oauthbearer.token.endpoint.url"), *path = km_secret_url_file(url);
	char jaas[2048] = "";
	km_sasl_oauth so;
	km_err rc;
	bool ok;

	*id = *secret = *scope = NULL;
	if (!url) {
		snprintf(why, whylen, "sasl.mechanism OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url: file:///PATH "
			 "(a file in mirror_file_dir holding the token) or an http(s) token endpoint");
		return false;
	}
	if (path && !km_mirror_file_allowed(km_mirror_get_opts(mi)->cfg->mirror_file_dir,
					    "sasl.oauthbearer.token.endpoint.url", path, why, whylen))
		return false;
	rc = km_state_mirror_secret(km_mirror_store(mi), m, "sasl.jaas.config", jaas, sizeof(jaas));
	if (rc != KM_OK && rc != KM_ERR_INVAL) {
		secret_why(rc, "sasl.jaas.config", sizeof(jaas), why, whylen);
		return false;
	}
	ok = rc == KM_ERR_INVAL || km_sasl_oauth_jaas(jaas, id, secret, scope, why, whylen) == KM_OK;
	OPENSSL_cleanse(jaas, sizeof(jaas));
	ok = ok && oauth_prop(mi, m, "sasl.oauthbearer.client.credentials.client.id", id, why, whylen) &&
	     oauth_prop(mi, m, "sasl.oauthbearer.client.credentials.client.secret", secret, why, whylen) &&
	     oauth_prop(mi, m, "sasl.oauthbearer.scope", scope, why, whylen);
	so = (km_sasl_oauth){url, *id, *secret, *scope, "the mirror's sasl.oauthbearer.token.endpoint.url"};
	if (!ok || km_sasl_oauth_check(&so, why, whylen) != KM_OK)
		return false;
	o->sasl_oauthbearer_token_endpoint_url = url;
	o->sasl_oauthbearer_client_id = *id;
	o->sasl_oauthbearer_client_secret = *secret;
	o->sasl_oauthbearer_scope = *scope;
	o->sasl_oauthbearer_setting = so.setting;
	return true;
}

/* A secret string wiped and freed. */
static void free_secret(char *s)
{
	if (s) {
		OPENSSL_cleanse(s, strlen(s));
		free(s);
	}
}

km_cluster *km_mirror_source_cluster(km_mirror *mi, const km_state_mirror *m, const char *purpose,
				     int64_t max_frame, SSL_CTX **tls_out, void (*on_change)(void *arg), void *arg,
				     char *why, size_t whylen)
{
	km_state *st = km_mirror_store(mi);
	const km_mirror_opts *mopts = km_mirror_get_opts(mi);
	const char *boot = km_state_mirror_source(m), *proto = cfg_get(m, "security.protocol");
	const char *mech = cfg_get(m, "sasl.mechanism"), *user = cfg_get(m, "sasl.username");
	const char *algo = cfg_get(m, "ssl.endpoint.identification.algorithm");
	char pass[1024] = "", ubuf[512] = "", client_id[512], *kt = NULL, *pr = NULL, *svc = NULL;
	char *oid = NULL, *osecret = NULL, *oscope = NULL;
	km_hostport hps[64];
	size_t nhp = 0;
	km_net_client_opts o;
	km_cluster *cl = NULL;
	bool tls = proto && (!strcmp(proto, "SSL") || !strcmp(proto, "SASL_SSL"));
	bool sasl = proto && !strncmp(proto, "SASL_", 5);

	*tls_out = NULL;
	for (const char *p = boot; p && *p && nhp < 64;) {
		const char *comma = strchr(p, ',');
		size_t l = comma ? (size_t)(comma - p) : strlen(p);
		char one[300];
		while (l && *p == ' ')
			p++, l--;
		while (l && p[l - 1] == ' ')
			l--;
		if (l && l < sizeof(one)) {
			memcpy(one, p, l);
			one[l] = 0;
			if (km_hostport_parse(one, &hps[nhp]))
				nhp++;
		}
		p = comma ? comma + 1 : p + strlen(p);
	}
	if (!nhp) {
		snprintf(why, whylen, "bootstrap.servers names no host:port");
		return NULL;
	}
	if (tls && !(*tls_out = source_tls(mi, m, why, whylen)))
		return NULL;
	memset(&o, 0, sizeof(o));
	if (sasl && mech && !strcmp(mech, "GSSAPI")) {
		if (!source_kerberos(mi, m, &o, &kt, &pr, &svc, why, whylen))
			goto out;
	} else if (sasl && mech && !strcmp(mech, "OAUTHBEARER")) {
		if (!source_oauth(mi, m, &o, &oid, &osecret, &oscope, why, whylen))
			goto out;
	} else if (sasl) {
		if (!mech)
			mech = "PLAIN";
		if (!source_credentials(st, m, &user, ubuf, sizeof(ubuf), pass, sizeof(pass), why, whylen))
			goto out;
		o.sasl_username = user ? user : "";
		o.sasl_password = pass;
	}
	o.sasl_mechanism = sasl ? mech : NULL;
	{
		const char *cid = cfg_get(m, "client.id");
		/* The mirror's name and the pipeline in the client id: the source's operator can set quotas on it. */
		if (cid && *cid)
			snprintf(client_id, sizeof(client_id), "%s", cid);
		else
			snprintf(client_id, sizeof(client_id), "kmirrord/%s/%s/%s", mopts->instance,
				 km_state_mirror_name(m), purpose);
	}
	o.client_id = client_id;
	o.tls = *tls_out;
	o.tls_verify_host = !algo || strcmp(algo, "") != 0;
	o.request_timeout_ms = 31000; /* above a fetch's MaxWait */
	o.dns = km_mirror_dns(mi);
	o.max_frame_bytes = max_frame;
	if (!(cl = km_cluster_new(km_mirror_base(mi), "source", &o, hps, nhp, on_change, arg)))
		snprintf(why, whylen, "out of memory");
out:
	/* The cluster keeps its own copies of the credentials. */
	OPENSSL_cleanse(pass, sizeof(pass));
	free(kt);
	free(pr);
	free(svc);
	free(oid);
	free_secret(osecret);
	free(oscope);
	if (!cl && *tls_out) {
		SSL_CTX_free(*tls_out);
		*tls_out = NULL;
	}
	return cl;
}

km_cluster *km_mirror_dest_cluster(km_mirror *mi, const char *mirror, const char *purpose,
				   void (*on_change)(void *arg), void *arg)
{
	const km_mirror_opts *mo = km_mirror_get_opts(mi);
	const km_config *cfg = mo->cfg;
	km_net_client_opts o;
	char client_id[512];

	memset(&o, 0, sizeof(o));
	snprintf(client_id, sizeof(client_id), "kmirrord/%s/%s/%s", mo->instance, mirror, purpose);
	o.client_id = client_id;
	o.tls = mo->tls;
	km_net_client_opts_upstream(&o, cfg);
	o.connect_timeout_ms = cfg->upstream_connect_timeout_ms;
	o.request_timeout_ms = 40000; /* above the Produce timeout (30 s) */
	o.max_frame_bytes = 16 << 20;
	/*
	 * Produce requests of fetched batches are megabytes: a large send buffer takes most of one in
	 * a write, and the socket wakes the loop for more once per half of it, where autotuning's
	 * smaller buffer woke it every 75 KiB (docs/BENCHMARKS.md, "Catch-up CPU").
	 */
	o.sndbuf_bytes = 4 << 20;
	o.dns = km_mirror_dns(mi);
	return km_cluster_new(km_mirror_base(mi), "destination", &o, cfg->upstream, (size_t)cfg->upstream_count,
			       on_change, arg);
}
