/* The kmirror CLI's internal interface: parsed arguments, client properties, output writers, the RPC connection. */
#ifndef KMIRROR_CLI_H
#define KMIRROR_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kmirror/error.h"
#include "kmirror/wire.h"

/* Exit codes (docs/kmirror.1). */
enum {
	KM_CLI_EXIT_OK = 0,
	KM_CLI_EXIT_ERROR = 1, /* the server refused, or kmirrord could not be reached */
	KM_CLI_EXIT_USAGE = 2, /* bad arguments or properties */
	KM_CLI_EXIT_TIMEOUT = 3, /* a wait ran out (promote --wait-ms): nothing was done */
};

typedef enum {
	KM_CLI_CMD_NONE = 0,
	KM_CLI_CMD_CREATE,
	KM_CLI_CMD_LIST,
	KM_CLI_CMD_DESCRIBE,
	KM_CLI_CMD_ALTER,
	KM_CLI_CMD_DELETE,
	KM_CLI_CMD_START,
	KM_CLI_CMD_STOP,
	KM_CLI_CMD_PAUSE,
	KM_CLI_CMD_RESUME,
	KM_CLI_CMD_LAST_OFFSETS,
	KM_CLI_CMD_PROMOTE,
	KM_CLI_CMD_REVERSE,
	KM_CLI_CMD_SWAP_UPSTREAM,
} km_cli_cmd;

/* "create", ..., "last-mirrored-offsets"; NULL for none. */
const char *km_cli_cmd_name(km_cli_cmd cmd);

/* A mirror config given on the command line or in --config-file; value NULL: delete it (alter). */
typedef struct km_cli_kv {
	char *name;
	char *value;
} km_cli_kv;

typedef struct km_cli_kvs {
	km_cli_kv *items;
	size_t count, cap;
} km_cli_kvs;

/* Set name=value (a later one replaces an earlier one of the same name). false: no memory. */
bool km_cli_kvs_set(km_cli_kvs *kv, const char *name, const char *value);
const km_cli_kv *km_cli_kvs_get(const km_cli_kvs *kv, const char *name);
void km_cli_kvs_free(km_cli_kvs *kv);

#define KM_CLI_MAX_TOPICS 100000 /* names in one --topics list */

typedef struct km_cli_args {
	const char *bootstrap;      /* --bootstrap-server */
	const char *command_config; /* --command-config FILE */
	bool json;                  /* --output json */
	int64_t timeout_ms;         /* --timeout-ms, default 30000 */
	km_cli_cmd cmd;
	bool help;                  /* --help (for cmd, or general when cmd is NONE) */
	bool version;               /* --version */
	const char *mirror;         /* --mirror */
	const char *source_bootstrap; /* --source-bootstrap (create) */
	const char *config_file;    /* --config-file (create, alter) */
	bool validate_only;         /* --validate-only (create) */
	km_cli_kvs configs;         /* --config-file, --config k=v over it (create, alter), then --delete-config k (alter) */
	char inline_secret[64];     /* the first secret key given as --config KEY=VALUE ("": none); kmirror warns */
	char **topics;              /* --topics a,b (NULL: none given) */
	size_t ntopics;
	const char *topics_regex;   /* --topics-regex */
	bool dry_run;               /* --dry-run (stop, promote): report the records at risk, stop nothing */
	bool adopt_existing;        /* --adopt-existing (start): a topic here holding records no mirror wrote is started, they are hidden */
	int64_t wait_ms;            /* --wait-ms (promote, reverse): how long lag may take to reach zero, default 60000 */
	const char *peer_bootstrap; /* --peer-bootstrap (reverse): the kmirrord in front of the mirror's source */
	const char *peer_mirror;    /* --peer-mirror (reverse): the mirror there that mirrors back */
	const char *admin;          /* --admin HOST:PORT (swap-upstream): kmirrord's admin_listen or http_listen */
	const char *admin_ca;       /* --admin-ca FILE (swap-upstream): speak HTTPS, verifying kmirrord with this CA */
	const char *token_file;     /* --token-file (swap-upstream): the bearer token of admin_token_file */
	const char *to;             /* --to HOST:PORT,... (swap-upstream): the new upstream */
} km_cli_args;

/*
 * Parse argv (argv[0] is the program). Returns KM_CLI_EXIT_OK, or KM_CLI_EXIT_USAGE with a one-line
 * reason in err. --help and --version end parsing successfully with the flag set (checks of
 * required options are skipped then).
 */
int km_cli_parse(int argc, char **argv, km_cli_args *a, char *err, size_t errlen);
void km_cli_args_free(km_cli_args *a);
/* The usage text of a command (KM_CLI_CMD_NONE: the general one). */
void km_cli_usage(FILE *out, km_cli_cmd cmd);

/* ---- properties files (Java .properties syntax) and client properties ---- */

/*
 * Parse properties text into kv: key=value, key:value or key value lines, # and ! comments, a
 * backslash at the end of a line continues it, \t \n \r \f \uXXXX and \<char> escapes. Returns
 * KM_OK or KM_ERR_CONFIG with "line N: why" in err.
 */
km_err km_cli_props_parse(const char *text, size_t len, km_cli_kvs *kv, char *err, size_t errlen);
/* The same for a file; the error names the file. */
km_err km_cli_props_load(const char *path, km_cli_kvs *kv, char *err, size_t errlen);

/* A Java client's store as the properties give it (ssl.truststore.*, or ssl.keystore.* and ssl.key.password). */
typedef struct km_cli_store {
	char *location, *type, *password;
	char *certificates; /* inline PEM: ssl.truststore.certificates, ssl.keystore.certificate.chain */
	char *key, *key_password; /* ssl.keystore.key, ssl.key.password */
} km_cli_store;

/* How the CLI connects to kmirrord, from --command-config. Strings owned. */
typedef struct km_cli_client {
	bool tls;
	bool sasl;
	bool verify_host;   /* ssl.endpoint.identification.algorithm=https (the default) */
	char *sasl_mechanism; /* PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI, OAUTHBEARER */
	char *username;
	char *password;
	/* GSSAPI: keytab and principal (both NULL: the default credentials cache), the brokers' service name. */
	char *krb5_keytab, *krb5_principal, *krb5_service;
	/* OAUTHBEARER: sasl.oauthbearer.token.endpoint.url (file:///PATH or http(s)), the JAAS line's client credentials. */
	char *oauth_url, *oauth_client_id, *oauth_client_secret, *oauth_scope;
	char *ca_file, *cert_file, *key_file;
	km_cli_store truststore, keystore; /* used when a location or inline PEM is given */
	char *client_id;
} km_cli_client;

/*
 * The username and password of a sasl.jaas.config value (PlainLoginModule or ScramLoginModule),
 * and *module_mechanism "PLAIN" or "SCRAM" from the module. KM_ERR_CONFIG with a reason otherwise.
 */
km_err km_cli_jaas_parse(const char *jaas, char **username, char **password, const char **module_mechanism,
			 char *err, size_t errlen);
/*
 * Client settings from Kafka tool properties (kv may be empty: PLAINTEXT). Java-only properties
 * (keystores, truststores) and unsupported mechanisms are refused with what to use instead.
 * Unknown keys are listed in warn (if not NULL) and otherwise ignored.
 */
km_err km_cli_client_from_props(const km_cli_kvs *kv, km_cli_client *c, char *err, size_t errlen, char *warn,
				size_t warnlen);
void km_cli_client_free(km_cli_client *c);
/* The store has a file or inline PEM (a password or type alone is not a store). */
bool km_cli_store_given(const km_cli_store *s);

/* ---- output ---- */

/* A JSON writer to a FILE: compact, keys in the order written, strings escaped (invalid UTF-8 as U+FFFD). */
#define KM_CLI_JSON_DEPTH 16
typedef struct km_cli_json {
	FILE *f;
	int depth;
	bool first[KM_CLI_JSON_DEPTH];
	bool after_key;
} km_cli_json;

void km_cli_json_init(km_cli_json *j, FILE *f);
void km_cli_json_obj(km_cli_json *j);
void km_cli_json_obj_end(km_cli_json *j);
void km_cli_json_arr(km_cli_json *j);
void km_cli_json_arr_end(km_cli_json *j);
void km_cli_json_key(km_cli_json *j, const char *key);
/* len -1: null; otherwise len bytes of p. */
void km_cli_json_strn(km_cli_json *j, const char *p, int32_t len);
void km_cli_json_str(km_cli_json *j, const char *s); /* NULL: null */
void km_cli_json_int(km_cli_json *j, int64_t v);
void km_cli_json_double(km_cli_json *j, double v); /* finite values only, 3 decimals */
void km_cli_json_bool(km_cli_json *j, bool v);
void km_cli_json_null(km_cli_json *j);
/* A topic id as Kafka's tools print it; null when zero (not known). */
void km_cli_json_uuid(km_cli_json *j, const km_uuid *u);
/* Write s as a JSON string literal (quotes included). */
void km_cli_json_escape(FILE *f, const char *p, size_t len);

/* A text table: a header row and rows of cells, printed with columns aligned (two spaces apart). */
typedef struct km_cli_table {
	size_t ncols;
	char **cells; /* row-major, header first */
	size_t nrows, cap;
} km_cli_table;

bool km_cli_table_init(km_cli_table *t, size_t ncols, const char *const *headers);
/* Add a row of ncols cells (NULL prints as "-"); false: no memory. */
bool km_cli_table_row(km_cli_table *t, const char *const *cells);
void km_cli_table_print(const km_cli_table *t, FILE *f);
void km_cli_table_free(km_cli_table *t);

/* "2026-01-02T03:04:05Z" for ms since the epoch, "-" for a negative time. */
void km_cli_format_time(int64_t ms, char *buf, size_t len);

/* ---- the connection to kmirrord ---- */

typedef struct km_cli_conn km_cli_conn;

/*
 * Connect to the first address of bootstrap (host:port[,host:port...], [v6]:port) that answers,
 * with ApiVersions, TLS and SASL done, and (kmirrord) check that it advertises the mirror RPCs.
 * NULL with a one-line reason in err.
 */
km_cli_conn *km_cli_connect(const char *bootstrap, const km_cli_client *cl, int64_t timeout_ms, bool kmirrord,
			    char *err, size_t errlen);
/* The negotiated version of api_key (-1: not offered). */
int16_t km_cli_conn_version(const km_cli_conn *cc, int16_t api_key);
/*
 * One request and its response body (malloc'd, *resp freed by the caller). KM_ERR_TIMEOUT,
 * KM_ERR_CLOSED, ... with a reason in err.
 */
km_err km_cli_call(km_cli_conn *cc, int16_t api_key, int16_t version, const uint8_t *body, size_t len,
		   uint8_t **resp, size_t *resp_len, char *err, size_t errlen);
void km_cli_conn_free(km_cli_conn *cc);

/* Split "host:port" or "[v6]:port"; false when malformed. */
bool km_cli_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port);

/* ---- commands ---- */

struct km_describe_mirrors_response;
/*
 * describe's output of a decoded DescribeMirrorsResponse: per mirror its configuration, its
 * metadata sync and its partitions as tables, or with json one document (docs/kmirror.1).
 */
void km_cli_describe_print(FILE *out, const struct km_describe_mirrors_response *resp, bool json);

/*
 * swap-upstream, over kmirrord's HTTP admin endpoint (not the Kafka listener): POST the new
 * upstream, then follow GET /admin/upstream until the swap took effect and the previous upstream's
 * connections moved, printing progress to errf. Returns the exit code.
 */
int km_cli_swap_upstream(const km_cli_args *a, FILE *out, FILE *errf);

/* Run the parsed command against kmirrord; returns the exit code. */
int km_cli_run(const km_cli_args *a, FILE *out, FILE *errf);

#endif
