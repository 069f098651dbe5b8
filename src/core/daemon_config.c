/* kmirrord configuration: the option table of km_config, and the cross-option rules the engine cannot know. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kmirror/daemon_config.h"
#include "kmirror/log.h"
#include "kmirror/secret.h"

#define OFF(f) offsetof(km_config, f)
#define I64MAX INT64_MAX

static const km_opt_enum log_levels = {"log level", km_log_level_names, KM_LOG_TRACE + 1, false};

static const char *const client_auth_names[] = {"none", "requested", "required"};
static const km_opt_enum client_auth = {NULL, client_auth_names, 3, false};

/* The mechanisms src/net provides (a unit test keeps the two in step); names are case-sensitive. */
static const char *const sasl_names[] = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"};
static const km_opt_enum sasl_mechanisms = {NULL, sasl_names, 5, true};

/* The code a refused write to a read-only mirror topic gets (km_read_only_error). */
static const char *const read_only_error_names[] = {"policy_violation", "topic_authorization_failed", "kmirror"};
static const km_opt_enum read_only_errors = {NULL, read_only_error_names, 3, false};

/* Which mirrors' pipelines this kmirrord runs (km_pipelines_mode). */
static const char *const pipelines_names[] = {"all", "owned", "none"};
static const km_opt_enum pipelines_modes = {NULL, pipelines_names, 3, false};

static const km_option options[] = {
	{.name = "listen", .type = KM_OPT_HOSTPORT, .offset = OFF(listen), .def = "0.0.0.0:9092",
	 .doc = "Bootstrap listener. Clients put this address in bootstrap.servers."},
	{.name = "listen_reuseport", .type = KM_OPT_BOOL, .offset = OFF(listen_reuseport), .def = "false",
	 .doc = "Open the client listeners (listen and every broker port) with SO_REUSEPORT, so that several "
		"kmirrord processes of one user on this host serve the same ports and the kernel spreads new "
		"connections over them (docs/operations.md, \"Several instances\"). Every process sharing the ports "
		"needs it, and the same listen, broker_port_base and advertised_host. The HTTP listeners are never "
		"shared: each process needs its own http_listen."},
	{.name = "advertised_host", .type = KM_OPT_STRING, .offset = OFF(advertised_host), .def = "localhost",
	 .reloadable = true,
	 .doc = "Host name the proxy puts in every broker endpoint it returns to clients (Metadata, "
		 "FindCoordinator, DescribeCluster, Produce/Fetch NodeEndpoints)."},
	{.name = "broker_port_base", .type = KM_OPT_INT, .offset = OFF(broker_port_base), .def = "19092", .min = 1,
	 .max = 65535,
	 .doc = "Upstream broker node N is served on port broker_port_base + N (same bind host as listen)."},
	{.name = "broker_port_count", .type = KM_OPT_INT, .offset = OFF(broker_port_count), .def = "1000", .min = 1,
	 .max = 65535,
	 .doc = "Node ids 0 .. broker_port_count-1 get a port; a broker with a larger id is logged and not "
		 "reachable through the proxy."},
	{.name = "upstream", .type = KM_OPT_HOSTPORT_LIST, .offset = OFF(upstream), .def = "",
	 .count_offset = OFF(upstream_count), .max = KM_CONFIG_MAX_UPSTREAMS, .reloadable = true,
	 .doc = "Bootstrap addresses of the upstream (destination) cluster, comma separated. Required. "
		 "A reload affects new connections and the next metadata refresh."},
	{.name = "http_listen", .type = KM_OPT_HOSTPORT, .offset = OFF(http_listen), .def = "",
	 .doc = "Address of the HTTP endpoint serving /metrics, /readyz, /healthz and, unless admin_listen is set, "
		"/admin/upstream; empty disables it."},
	{.name = "admin_listen", .type = KM_OPT_HOSTPORT, .offset = OFF(admin_listen), .def = "",
	 .doc = "Address of an HTTP listener of its own for the admin routes (/admin/upstream), for example "
		"127.0.0.1:9645; http_listen then answers 404 there and serves only /metrics, /readyz and /healthz. "
		"Empty: the admin routes are served on http_listen."},
	{.name = "admin_tls_cert_file", .type = KM_OPT_STRING, .offset = OFF(admin_tls_cert_file), .def = "",
	 .doc = "PEM certificate (chain) with which admin_listen speaks HTTPS; set with admin_tls_key_file. "
		"Turning TLS on or off needs a restart, but the files are read again on every reload (rotation in "
		"place); new connections use them."},
	{.name = "admin_tls_key_file", .type = KM_OPT_STRING, .offset = OFF(admin_tls_key_file), .def = "",
	 .doc = "PEM private key for admin_tls_cert_file."},
	{.name = "http_max_connections", .type = KM_OPT_INT, .offset = OFF(http_max_connections), .def = "64",
	 .min = 0, .max = 1000000, .reloadable = true,
	 .doc = "HTTP connections open at once on each HTTP listener (http_listen, admin_listen); one more is "
		"closed at once (kmirror_http_rejected_total{reason=\"max_connections\"}). 0: no cap."},
	{.name = "http_max_header_bytes", .type = KM_OPT_INT, .offset = OFF(http_max_header_bytes), .def = "8192",
	 .min = 256, .max = 1048576, .reloadable = true,
	 .doc = "Largest HTTP request line and header lines together; a request over it is answered 400 and "
		"closed."},
	{.name = "http_max_headers", .type = KM_OPT_INT, .offset = OFF(http_max_headers), .def = "64", .min = 1,
	 .max = 10000, .reloadable = true,
	 .doc = "Most header lines in one HTTP request; more are answered 431."},
	{.name = "http_request_timeout_ms", .type = KM_OPT_INT, .offset = OFF(http_request_timeout_ms),
	 .def = "10000", .min = 100, .max = I64MAX, .reloadable = true,
	 .doc = "An HTTP request must have arrived whole (request line, headers, body) this long after its "
		"connection opened or its previous answer was made, and an answer must have been read by then; "
		"otherwise the connection is closed (a slow or idle client holds no connection longer)."},
	{.name = "upstream_file", .type = KM_OPT_STRING, .offset = OFF(upstream_file), .def = "",
	 .doc = "File that persists an upstream swap (docs/proxy.md, \"Upstream swap\"): written before the swap "
		"takes effect; when it exists at start, its upstream replaces the upstream option (also on "
		"reload). Empty: swaps are refused."},
	{.name = "admin_token_file", .type = KM_OPT_STRING, .offset = OFF(admin_token_file), .def = "",
	 .reloadable = true,
	 .doc = "File holding the bearer token of the HTTP admin endpoint (POST /admin/upstream), read on "
		"every request; it must not be readable or writable by group or others (chmod 600), else the admin "
		"endpoint answers 403. Empty: the admin endpoint answers 403."},
	{.name = "log_level", .type = KM_OPT_ENUM, .offset = OFF(log_level), .def = "info", .choices = &log_levels,
	 .reloadable = true,
	 .doc = "error, warn, info, debug or trace."},
	{.name = "log_fetch_topics", .type = KM_OPT_STRING, .offset = OFF(log_fetch_topics), .def = "",
	 .reloadable = true,
	 .doc = "Mirror topics (comma-separated) whose Fetch answers through the proxy are logged, one line per "
		"partition (component fetch-trace): the offset asked, the tail, each batch's destination offset, "
		"producer id and kind and the offset shown (or hidden), the aborted transactions as sent and as shown. "
		"For finding why a consumer skipped or read again records of a mirror topic; a line per answer. "
		"Empty: none."},
	{.name = "max_frame_bytes", .type = KM_OPT_INT, .offset = OFF(max_frame_bytes), .def = "104857600", .min = 64,
	 .max = INT32_MAX, .reloadable = true,
	 .doc = "Largest request or response frame accepted (like the broker's socket.request.max.bytes); "
		 "a larger frame closes the connection."},
	{.name = "max_auth_frame_bytes", .type = KM_OPT_INT, .offset = OFF(max_auth_frame_bytes), .def = "524288",
	 .min = 64, .max = I64MAX, .reloadable = true,
	 .doc = "Largest ApiVersions, SaslHandshake or SaslAuthenticate request frame (what comes before "
		 "authentication; a broker's sasl.server.max.receive.size); a larger one closes the connection."},
	{.name = "max_local_frame_bytes", .type = KM_OPT_INT, .offset = OFF(max_local_frame_bytes), .def = "1048576",
	 .min = 64, .max = I64MAX, .reloadable = true,
	 .doc = "Largest mirror RPC request frame (kmirrord reads and answers them itself); a larger one closes "
		 "the connection."},
	{.name = "idle_timeout_ms", .type = KM_OPT_INT, .offset = OFF(idle_timeout_ms), .def = "600000", .min = 0,
	 .max = I64MAX, .reloadable = true,
	 .doc = "A client connection with no traffic and no request in flight for this long is closed "
		 "(0 = never)."},
	{.name = "frame_timeout_ms", .type = KM_OPT_INT, .offset = OFF(frame_timeout_ms), .def = "30000", .min = 0,
	 .max = I64MAX, .reloadable = true,
	 .doc = "A partially received frame that makes no progress for this long closes the connection "
		 "(0 = never)."},
	{.name = "upstream_connect_timeout_ms", .type = KM_OPT_INT, .offset = OFF(upstream_connect_timeout_ms),
	 .def = "10000", .min = 1, .max = I64MAX, .reloadable = true,
	 .doc = "Time allowed to connect (and finish TLS) to an upstream broker."},
	{.name = "upstream_request_timeout_ms", .type = KM_OPT_INT, .offset = OFF(upstream_request_timeout_ms),
	 .def = "300000", .min = 0, .max = I64MAX, .reloadable = true,
	 .doc = "A forwarded request whose response has not started after this long, or a request still "
		 "waiting for the mirror state to load, closes the client connection (0 = never). Keep it above "
		 "the clients' own request timeouts."},
	{.name = "metadata_refresh_ms", .type = KM_OPT_INT, .offset = OFF(metadata_refresh_ms), .def = "30000",
	 .min = 100, .max = I64MAX, .reloadable = true,
	 .doc = "How often the proxy asks the upstream for its broker list (new brokers get their port)."},
	{.name = "max_inflight_requests", .type = KM_OPT_INT, .offset = OFF(max_inflight_requests), .def = "1000",
	 .min = 1, .max = 1000000, .reloadable = true,
	 .doc = "Requests in flight per client connection; beyond it the proxy stops reading from the client."},
	{.name = "connection_buffer_bytes", .type = KM_OPT_INT, .offset = OFF(connection_buffer_bytes),
	 .def = "4194304", .min = 4096, .max = I64MAX, .reloadable = true,
	 .doc = "Bytes queued towards a peer above which the proxy stops reading from the other side "
		 "(backpressure)."},
	{.name = "splice_min_bytes", .type = KM_OPT_INT, .offset = OFF(splice_min_bytes), .def = "65536", .min = 0,
	 .max = I64MAX, .reloadable = true,
	 .doc = "A Fetch record set, or the rest of a response passed on untouched, with at least this many bytes "
		"still to arrive goes from the broker's socket to the client's with splice(2), never through "
		"kmirrord's memory, when both connections are plain TCP (kmirror_spliced_bytes_total). 0: never."},
	{.name = "max_connections", .type = KM_OPT_INT, .offset = OFF(max_connections), .def = "10000", .min = 0,
	 .max = INT32_MAX, .reloadable = true,
	 .doc = "Client connections open at once, all Kafka listeners together; one more is closed as soon as it "
		"is accepted (kmirror_connections_rejected_total{reason=\"max_connections\"}). Each client connection "
		"may hold an upstream connection too, and a pipe (two descriptors) once it spliced a Fetch answer: "
		"keep four times this below the open file limit. 0: no cap."},
	{.name = "max_connections_per_ip", .type = KM_OPT_INT, .offset = OFF(max_connections_per_ip), .def = "1000",
	 .min = 0, .max = INT32_MAX, .reloadable = true,
	 .doc = "Client connections open at once from one source address; one more is closed as soon as it is "
		"accepted (kmirror_connections_rejected_total{reason=\"max_connections_per_ip\"}). 0: no cap."},
	{.name = "drain_timeout_ms", .type = KM_OPT_INT, .offset = OFF(drain_timeout_ms), .def = "30000", .min = 0,
	 .max = I64MAX, .reloadable = true,
	 .doc = "On SIGTERM, the time over which client connections are closed; whatever is left then is "
		 "closed at once and the daemon exits. After an upstream swap, the time over which the previous "
		 "upstream's connections move over."},
	{.name = "drain_interval_ms", .type = KM_OPT_INT, .offset = OFF(drain_interval_ms), .def = "1000", .min = 10,
	 .max = I64MAX, .reloadable = true,
	 .doc = "On SIGTERM (and after an upstream swap), the pause between two closing rounds (librdkafka "
		 "clients need about a second between brokers); each round closes an even share of the connections."},
	{.name = "swap_fetch_hold_ms", .type = KM_OPT_INT, .offset = OFF(swap_fetch_hold_ms), .def = "30000", .min = 0,
	 .max = I64MAX, .reloadable = true,
	 .doc = "After an upstream swap, for this long after the last connection moved over: a Fetch the new "
		 "cluster answers OFFSET_OUT_OF_RANGE reaches the client as OFFSET_NOT_AVAILABLE (retried), "
		 "since its position may be the previous cluster's; its group rejoins at the new cluster's "
		 "committed offsets within a heartbeat instead of resetting. 0: off."},
	{.name = "read_only_error", .type = KM_OPT_ENUM, .offset = OFF(read_only_error), .def = "policy_violation",
	 .choices = &read_only_errors, .reloadable = true,
	 .doc = "The error a write, DeleteRecords, DeleteTopics or CreatePartitions on a read-only mirror topic "
		 "gets: policy_violation (POLICY_VIOLATION, 44: every client names it and none retries it; the Java "
		 "producer and kafka-python show kmirrord's message with it), topic_authorization_failed (29), or "
		 "kmirror (kmirror's own READ_ONLY_TOPIC, 32000, for tools that know it; stock clients show it as an "
		 "unknown error). docs/protocol.md, \"Read-only mirror topics\", has what each client shows."},
	{.name = "tls_cert_file", .type = KM_OPT_STRING, .offset = OFF(tls_cert_file), .def = "", .reloadable = true,
	 .doc = "PEM certificate (chain) for client-facing TLS; set with tls_key_file to make every listener TLS. "
		 "TLS files are read again on every reload (rotation in place); new connections use them."},
	{.name = "tls_key_file", .type = KM_OPT_STRING, .offset = OFF(tls_key_file), .def = "", .reloadable = true,
	 .doc = "PEM private key for client-facing TLS."},
	{.name = "tls_ca_file", .type = KM_OPT_STRING, .offset = OFF(tls_ca_file), .def = "", .reloadable = true,
	 .doc = "PEM CA bundle used to verify client certificates (with tls_client_auth)."},
	{.name = "tls_keystore_file", .type = KM_OPT_STRING, .offset = OFF(tls_keystore_file), .def = "",
	 .reloadable = true,
	 .doc = "PKCS12 keystore (Kafka's ssl.keystore.type=PKCS12) holding the listener's private key and "
		 "certificate chain, instead of tls_cert_file and tls_key_file; a JKS store is refused with the "
		 "keytool command that converts it. Read again on every reload."},
	{.name = "tls_keystore_password", .type = KM_OPT_STRING, .offset = OFF(tls_keystore_password), .def = "",
	 .reloadable = true, .secret = true,
	 .doc = "Password of tls_keystore_file (a PKCS12 store has one password, for the store and its key)."},
	{.name = "tls_truststore_file", .type = KM_OPT_STRING, .offset = OFF(tls_truststore_file), .def = "",
	 .reloadable = true,
	 .doc = "PKCS12 truststore of the CAs client certificates are verified against (with tls_client_auth), "
		 "instead of tls_ca_file."},
	{.name = "tls_truststore_password", .type = KM_OPT_STRING, .offset = OFF(tls_truststore_password), .def = "",
	 .reloadable = true, .secret = true,
	 .doc = "Password of tls_truststore_file; empty reads only the certificates the store keeps unencrypted."},
	{.name = "tls_client_auth", .type = KM_OPT_ENUM, .offset = OFF(tls_client_auth), .def = "none",
	 .choices = &client_auth, .reloadable = true,
	 .doc = "Client certificates: none, requested (verified when sent) or required."},
	{.name = "upstream_tls", .type = KM_OPT_BOOL, .offset = OFF(upstream_tls), .def = "false", .reloadable = true,
	 .doc = "Connect to the upstream brokers with TLS."},
	{.name = "upstream_tls_ca_file", .type = KM_OPT_STRING, .offset = OFF(upstream_tls_ca_file), .def = "",
	 .reloadable = true,
	 .doc = "PEM CA bundle for verifying the upstream brokers (empty: the system store)."},
	{.name = "upstream_tls_cert_file", .type = KM_OPT_STRING, .offset = OFF(upstream_tls_cert_file), .def = "",
	 .reloadable = true,
	 .doc = "PEM client certificate presented to the upstream brokers (mutual TLS)."},
	{.name = "upstream_tls_key_file", .type = KM_OPT_STRING, .offset = OFF(upstream_tls_key_file), .def = "",
	 .reloadable = true,
	 .doc = "PEM private key for upstream_tls_cert_file."},
	{.name = "upstream_tls_keystore_file", .type = KM_OPT_STRING, .offset = OFF(upstream_tls_keystore_file),
	 .def = "", .reloadable = true,
	 .doc = "PKCS12 keystore with the client certificate kmirrord presents to the upstream brokers (mutual "
		 "TLS), instead of upstream_tls_cert_file and upstream_tls_key_file."},
	{.name = "upstream_tls_keystore_password", .type = KM_OPT_STRING, .offset = OFF(upstream_tls_keystore_password),
	 .def = "", .reloadable = true, .secret = true,
	 .doc = "Password of upstream_tls_keystore_file."},
	{.name = "upstream_tls_truststore_file", .type = KM_OPT_STRING, .offset = OFF(upstream_tls_truststore_file),
	 .def = "", .reloadable = true,
	 .doc = "PKCS12 truststore of the CAs that verify the upstream brokers, instead of upstream_tls_ca_file."},
	{.name = "upstream_tls_truststore_password", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_tls_truststore_password), .def = "", .reloadable = true, .secret = true,
	 .doc = "Password of upstream_tls_truststore_file; empty reads only the certificates the store keeps "
		 "unencrypted."},
	{.name = "upstream_tls_verify_hostname", .type = KM_OPT_BOOL, .offset = OFF(upstream_tls_verify_hostname),
	 .def = "true", .reloadable = true,
	 .doc = "Check that the upstream broker certificate matches the host name connected to."},
	{.name = "upstream_sasl_mechanism", .type = KM_OPT_STRING, .offset = OFF(upstream_sasl_mechanism), .def = "",
	 .choices = &sasl_mechanisms, .reloadable = true,
	 .doc = "SASL mechanism of kmirrord's own connections to the destination (metadata refresh, the state "
		 "store, the mirror pipelines and metadata sync): empty (none), PLAIN, SCRAM-SHA-256, "
		 "SCRAM-SHA-512, GSSAPI (Kerberos: upstream_sasl_kerberos_*) or OAUTHBEARER "
		 "(upstream_sasl_oauthbearer_*). Its principal is kmirrord's on the destination: it writes the mirror topics and "
		 "mirror_state_topic. Client connections authenticate themselves (SASL is passed through)."},
	{.name = "upstream_sasl_username", .type = KM_OPT_STRING, .offset = OFF(upstream_sasl_username), .def = "",
	 .reloadable = true,
	 .doc = "User name for upstream_sasl_mechanism."},
	{.name = "upstream_sasl_password", .type = KM_OPT_STRING, .offset = OFF(upstream_sasl_password), .def = "",
	 .reloadable = true, .secret = true,
	 .doc = "Password for upstream_sasl_mechanism. Given as a flag (--upstream-sasl-password) it is visible "
		 "in the process list, and kmirrord warns: prefer upstream_sasl_password_file."},
	{.name = "upstream_sasl_password_file", .type = KM_OPT_STRING, .offset = OFF(upstream_sasl_password_file),
	 .def = "", .reloadable = true,
	 .doc = "File holding the password for upstream_sasl_mechanism (one trailing newline is ignored), read "
		"at start and on every reload; instead of upstream_sasl_password. Checked like every secret file "
		"(secret_file_mode_check)."},
	{.name = "upstream_sasl_kerberos_service_name", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_sasl_kerberos_service_name), .def = "kafka", .reloadable = true,
	 .doc = "GSSAPI: the Kerberos service name of the destination's brokers (their "
		"sasl.kerberos.service.name); kmirrord asks for tickets to SERVICE/BROKER-HOST, the broker's host as "
		"kmirrord connects to it."},
	{.name = "upstream_sasl_kerberos_keytab", .type = KM_OPT_STRING, .offset = OFF(upstream_sasl_kerberos_keytab),
	 .def = "", .reloadable = true,
	 .doc = "GSSAPI: the keytab holding upstream_sasl_kerberos_principal's key. kmirrord gets its tickets from "
		"it into a credentials cache in its own memory (no file, nothing shared with other processes) and "
		"gets them again before they expire. Empty: the default credentials cache (KRB5CCNAME, kept "
		"fresh by kinit or k5start). Checked like every secret file (secret_file_mode_check)."},
	{.name = "upstream_sasl_kerberos_principal", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_sasl_kerberos_principal), .def = "", .reloadable = true,
	 .doc = "GSSAPI: kmirrord's own principal (kmirrord/host.example.com@EXAMPLE.COM), with "
		"upstream_sasl_kerberos_keytab."},
	{.name = "upstream_sasl_kerberos_host", .type = KM_OPT_STRING, .offset = OFF(upstream_sasl_kerberos_host),
	 .def = "", .reloadable = true,
	 .doc = "GSSAPI: the host part of the brokers' service principal when it is not the host kmirrord connects "
		"to. A Kerberos client through kmirrord asks for a ticket to SERVICE/advertised_host, which kmirrord "
		"passes on: the brokers' listener that kmirrord fronts must then be that principal, and kmirrord's "
		"own connections to it need this set to advertised_host (docs/security.md, \"Kerberos\"). Empty: the "
		"host connected to."},
	{.name = "upstream_sasl_oauthbearer_token_endpoint_url", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_sasl_oauthbearer_token_endpoint_url), .def = "", .reloadable = true,
	 .doc = "OAUTHBEARER: where kmirrord's token comes from (Kafka's sasl.oauthbearer.token.endpoint.url): "
		"file:///PATH, a file holding the token (a JWT) that something else keeps fresh. kmirrord reads it "
		"at start and on every reload (an unreadable or expired token is refused then), again whenever it "
		"changes and once 80% of the token's life has passed; every new connection gets the file's current "
		"token. Checked like every secret file (secret_file_mode_check). Or http(s)://HOST/PATH, the identity "
		"provider's token endpoint: kmirrord asks it for tokens with the client-credentials grant "
		"(upstream_sasl_oauthbearer_client_id, _client_secret or _client_secret_file, _scope) without holding "
		"its event loop, and again once 80% of a token's life has passed; https is verified against the "
		"system's CAs."},
	{.name = "upstream_sasl_oauthbearer_token_command", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_sasl_oauthbearer_token_command), .def = "", .reloadable = true,
	 .doc = "OAUTHBEARER: a command that prints kmirrord's token (a JWT) on its standard output and exits 0, "
		"run with /bin/sh -c as kmirrord's user, instead of upstream_sasl_oauthbearer_token_endpoint_url "
		"(an identity provider's CLI, a vault agent). Run at start and on every reload (a failure, no token "
		"or an expired one is refused then), and again, off kmirrord's event loop, once 80% of a token's "
		"life has passed; 10 s at most per run. Only kmirrord.conf can name a command: a mirror's "
		"configuration, which clients of kmirrord write, cannot."},
	{.name = "upstream_sasl_oauthbearer_client_id", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_sasl_oauthbearer_client_id), .def = "", .reloadable = true,
	 .doc = "OAUTHBEARER with a token endpoint: kmirrord's client id there (Kafka's clientId)."},
	{.name = "upstream_sasl_oauthbearer_client_secret", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_sasl_oauthbearer_client_secret), .def = "", .reloadable = true, .secret = true,
	 .doc = "OAUTHBEARER with a token endpoint: the client's secret (Kafka's clientSecret); prefer "
		"upstream_sasl_oauthbearer_client_secret_file."},
	{.name = "upstream_sasl_oauthbearer_client_secret_file", .type = KM_OPT_STRING,
	 .offset = OFF(upstream_sasl_oauthbearer_client_secret_file), .def = "", .reloadable = true,
	 .doc = "File holding upstream_sasl_oauthbearer_client_secret (one trailing newline is ignored), read at "
		"start and on every reload. Checked like every secret file (secret_file_mode_check)."},
	{.name = "upstream_sasl_oauthbearer_scope", .type = KM_OPT_STRING, .offset = OFF(upstream_sasl_oauthbearer_scope),
	 .def = "", .reloadable = true,
	 .doc = "OAUTHBEARER with a token endpoint: the scope asked for (Kafka's scope); empty: none."},
	{.name = "mirror_state_topic", .type = KM_OPT_STRING, .offset = OFF(mirror_state_topic), .def = "__mirror_state",
	 .reloadable = false,
	 .doc = "The compacted topic on the destination holding the mirror definitions and every mirrored partition's "
		"state (docs/state.md). Created on the first CreateMirror."},
	{.name = "mirror_state_partitions", .type = KM_OPT_INT, .offset = OFF(mirror_state_partitions), .def = "16",
	 .min = 1, .max = 1000, .reloadable = false,
	 .doc = "Partitions of mirror_state_topic when kmirrord creates it (the proposal's mirror.topic.num.partitions)."},
	{.name = "mirror_state_replication_factor", .type = KM_OPT_INT, .offset = OFF(mirror_state_replication_factor),
	 .def = "-1", .min = -1, .max = 32767, .reloadable = false,
	 .doc = "Replication factor of mirror_state_topic when kmirrord creates it; -1: min(3, brokers)."},
	{.name = "mirror_pipelines", .type = KM_OPT_ENUM, .offset = OFF(mirror_pipelines), .def = "all",
	 .choices = &pipelines_modes,
	 .doc = "Which mirrors' pipelines (fetch from the source, write here, move partitions from PREPARING, "
		"PAUSING and STOPPING) and metadata sync this kmirrord runs: all (every mirror in the state: one "
		"kmirrord in front of the destination), owned (the mirrors the destination's consumer group "
		"__kmirror-sync gives it: several kmirrords share the mirrors, each run by one of them, and another "
		"takes over those of one that leaves or dies; the destination needs the consumer group protocol, "
		"Kafka 4.0+), or none (it follows the state, refuses writes to mirror topics, translates offsets "
		"and answers mirror RPCs; the mirrors run elsewhere). docs/operations.md, \"Several instances\"."},
	{.name = "mirror_sync_group", .type = KM_OPT_STRING, .offset = OFF(mirror_sync_group), .def = "__kmirror-sync",
	 .reloadable = false,
	 .doc = "The destination's consumer group through which kmirrords with mirror_pipelines = owned share the "
		"mirrors (set alike on every kmirrord of one state topic). One that cannot join it for "
		"mirror_sync_group_move_after_s moves them all to its next generation, <group>.1, <group>.2, ..., "
		"recorded in mirror_state_topic (docs/mirror.md, \"The sync group moves\"): ACLs on it are "
		"prefixed ones."},
	{.name = "mirror_sync_group_move_after_s", .type = KM_OPT_INT, .offset = OFF(mirror_sync_group_move_after_s),
	 .def = "120", .min = 0, .max = 86400, .reloadable = false,
	 .doc = "How long a kmirrord whose sync group's coordinator keeps answering with an error (the group "
		"cannot be loaded or is held by a group of another kind) waits before it moves every kmirrord to "
		"the group's next generation; 0: never (it warns every minute and runs no mirror meanwhile)."},
	{.name = "mirror_secret_key_file", .type = KM_OPT_STRING, .offset = OFF(mirror_secret_key_file), .def = "",
	 .reloadable = false,
	 .doc = "File holding the AES-256 key (32 raw bytes, or 64 hex characters) that encrypts mirror secrets "
		"(sasl.password, ...) in mirror_state_topic. Empty: mirrors with a secret are refused. Checked "
		"like every secret file (secret_file_mode_check)."},
	{.name = "mirror_file_dir", .type = KM_OPT_STRING, .offset = OFF(mirror_file_dir), .def = "", .reloadable = false,
	 .doc = "The directory a mirror's ssl.*.location files (CA, certificate, key, truststore, keystore) and the "
		 "keyTab of its Krb5LoginModule sasl.jaas.config must be in (symlinks and .. resolved). Empty: a "
		 "mirror may name no file. Whoever may create or alter a mirror chooses these paths and kmirrord "
		 "reads them with its own rights."},
	{.name = "secret_file_mode_check", .type = KM_OPT_BOOL, .offset = OFF(secret_file_mode_check), .def = "true",
	 .reloadable = true,
	 .doc = "A secret file (mirror_secret_key_file, upstream_sasl_password_file, upstream_sasl_kerberos_keytab, "
		"the file of upstream_sasl_oauthbearer_token_endpoint_url) "
		"that group or others may "
		"read or write (mode & 077) is refused, naming the chmod 600 to run. false: it is used, with a "
		"warning."},
};

static const km_opt_table table = {options, sizeof(options) / sizeof(options[0]), sizeof(km_config)};

const km_opt_table *km_config_table(void)
{
	return &table;
}

void km_config_init(km_config *cfg)
{
	/* Defaults are checked by the unit tests; a failure here is a bug in the table (or no memory). */
	if (km_opt_init(&table, cfg) != KM_OK)
		KM_ERROR("config", 0, "a default of the option table does not parse");
}

void km_config_free(km_config *cfg)
{
	km_opt_free(&table, cfg);
}

km_err km_config_copy(km_config *dst, const km_config *src)
{
	return km_opt_copy(&table, dst, src);
}

km_err km_config_set(km_config *cfg, const char *name, const char *value, char *err, size_t errlen)
{
	return km_opt_set(&table, cfg, name, value, err, errlen);
}

km_err km_config_load_file(km_config *cfg, const char *path, char *err, size_t errlen)
{
	return km_opt_load_file(&table, cfg, path, err, errlen);
}

static bool both_or_neither(const char *a, const char *b)
{
	return (a == NULL) == (b == NULL);
}

/*
 * Each TLS side takes its CAs, and its certificate, from PEM files or from a PKCS12 store, not both;
 * a store's password only with its store.
 */
static km_err tls_sources_valid(const km_config *cfg, char *err, size_t errlen)
{
	const struct {
		const char *pem_name, *pem, *store_name, *store, *pass_name, *pass;
	} sides[] = {
		{"tls_cert_file", cfg->tls_cert_file, "tls_keystore_file", cfg->tls_keystore_file,
		 "tls_keystore_password", cfg->tls_keystore_password},
		{"tls_ca_file", cfg->tls_ca_file, "tls_truststore_file", cfg->tls_truststore_file,
		 "tls_truststore_password", cfg->tls_truststore_password},
		{"upstream_tls_cert_file", cfg->upstream_tls_cert_file, "upstream_tls_keystore_file",
		 cfg->upstream_tls_keystore_file, "upstream_tls_keystore_password",
		 cfg->upstream_tls_keystore_password},
		{"upstream_tls_ca_file", cfg->upstream_tls_ca_file, "upstream_tls_truststore_file",
		 cfg->upstream_tls_truststore_file, "upstream_tls_truststore_password",
		 cfg->upstream_tls_truststore_password},
	};

	for (size_t i = 0; i < sizeof(sides) / sizeof(sides[0]); i++) {
		if (sides[i].pem && sides[i].store) {
			snprintf(err, errlen, "%s and %s say the same thing (a PEM file, a PKCS12 store): keep one",
				 sides[i].pem_name, sides[i].store_name);
			return KM_ERR_CONFIG;
		}
		if (sides[i].pass && !sides[i].store) {
			snprintf(err, errlen, "%s is the password of %s, which is not set", sides[i].pass_name,
				 sides[i].store_name);
			return KM_ERR_CONFIG;
		}
	}
	return KM_OK;
}

static bool mechanism_is(const km_config *cfg, const char *mech)
{
	return cfg->upstream_sasl_mechanism && !strcmp(cfg->upstream_sasl_mechanism, mech);
}

/* OAUTHBEARER's tokens come from an http(s) token endpoint (not a file). */
static bool token_endpoint(const km_config *cfg)
{
	const char *u = cfg->upstream_sasl_oauthbearer_token_endpoint_url;
	return mechanism_is(cfg, "OAUTHBEARER") && u && (!strncmp(u, "http://", 7) || !strncmp(u, "https://", 8));
}

km_err km_config_validate(const km_config *cfg, char *err, size_t errlen)
{
	if (cfg->upstream_count == 0) {
		snprintf(err, errlen, "upstream: at least one upstream broker address is required");
		return KM_ERR_CONFIG;
	}
	if (!cfg->advertised_host || !*cfg->advertised_host) {
		snprintf(err, errlen, "advertised_host: must not be empty");
		return KM_ERR_CONFIG;
	}
	if (cfg->listen.port == 0) {
		snprintf(err, errlen, "listen: a port is required");
		return KM_ERR_CONFIG;
	}
	if (cfg->broker_port_base + cfg->broker_port_count - 1 > 65535) {
		snprintf(err, errlen, "broker_port_base + broker_port_count - 1 = %" PRId64 " is above 65535",
			 cfg->broker_port_base + cfg->broker_port_count - 1);
		return KM_ERR_CONFIG;
	}
	if (cfg->listen.port >= cfg->broker_port_base &&
	    cfg->listen.port < cfg->broker_port_base + cfg->broker_port_count) {
		snprintf(err, errlen, "listen port %u falls inside the broker port range %" PRId64 "-%" PRId64,
			 cfg->listen.port, cfg->broker_port_base, cfg->broker_port_base + cfg->broker_port_count - 1);
		return KM_ERR_CONFIG;
	}
	if (!cfg->mirror_sync_group || !*cfg->mirror_sync_group || strlen(cfg->mirror_sync_group) > 200) {
		snprintf(err, errlen, "mirror_sync_group: a group name of 1 to 200 characters is required");
		return KM_ERR_CONFIG;
	}
	if (cfg->http_listen.port && cfg->http_listen.port == cfg->listen.port &&
	    strcmp(cfg->http_listen.host, cfg->listen.host) == 0) {
		snprintf(err, errlen, "http_listen: same address as listen");
		return KM_ERR_CONFIG;
	}
	if (cfg->admin_listen.port && ((cfg->admin_listen.port == cfg->listen.port &&
					strcmp(cfg->admin_listen.host, cfg->listen.host) == 0) ||
				       (cfg->admin_listen.port == cfg->http_listen.port &&
					strcmp(cfg->admin_listen.host, cfg->http_listen.host) == 0))) {
		snprintf(err, errlen, "admin_listen: same address as listen or http_listen");
		return KM_ERR_CONFIG;
	}
	if (!both_or_neither(cfg->admin_tls_cert_file, cfg->admin_tls_key_file)) {
		snprintf(err, errlen, "admin_tls_cert_file and admin_tls_key_file must be set together");
		return KM_ERR_CONFIG;
	}
	if (cfg->admin_tls_cert_file && !cfg->admin_listen.port) {
		snprintf(err, errlen, "admin_tls_cert_file needs admin_listen (TLS is for the admin listener only)");
		return KM_ERR_CONFIG;
	}
	if (!both_or_neither(cfg->tls_cert_file, cfg->tls_key_file)) {
		snprintf(err, errlen, "tls_cert_file and tls_key_file must be set together");
		return KM_ERR_CONFIG;
	}
	if (tls_sources_valid(cfg, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (cfg->tls_client_auth != KM_TLS_CLIENT_AUTH_NONE && (!(cfg->tls_cert_file || cfg->tls_keystore_file) ||
								!(cfg->tls_ca_file || cfg->tls_truststore_file))) {
		snprintf(err, errlen, "tls_client_auth needs the listener's certificate (tls_cert_file and "
			 "tls_key_file, or tls_keystore_file) and the CAs that verify clients (tls_ca_file or "
			 "tls_truststore_file)");
		return KM_ERR_CONFIG;
	}
	if (!both_or_neither(cfg->upstream_tls_cert_file, cfg->upstream_tls_key_file)) {
		snprintf(err, errlen, "upstream_tls_cert_file and upstream_tls_key_file must be set together");
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_password && cfg->upstream_sasl_password_file && !cfg->upstream_sasl_password_from_file) {
		snprintf(err, errlen, "upstream_sasl_password and upstream_sasl_password_file: set one of them, not both");
		return KM_ERR_CONFIG;
	}
	if ((cfg->upstream_sasl_oauthbearer_token_endpoint_url || cfg->upstream_sasl_oauthbearer_token_command) &&
	    !mechanism_is(cfg, "OAUTHBEARER")) {
		snprintf(err, errlen, "%s is for upstream_sasl_mechanism OAUTHBEARER",
			 cfg->upstream_sasl_oauthbearer_token_command ? "upstream_sasl_oauthbearer_token_command"
								      : "upstream_sasl_oauthbearer_token_endpoint_url");
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_oauthbearer_token_endpoint_url && cfg->upstream_sasl_oauthbearer_token_command) {
		snprintf(err, errlen, "upstream_sasl_oauthbearer_token_endpoint_url and upstream_sasl_oauthbearer_token_command: "
			 "set one of them, not both");
		return KM_ERR_CONFIG;
	}
	if (mechanism_is(cfg, "OAUTHBEARER") &&
	    (cfg->upstream_sasl_username || cfg->upstream_sasl_password || cfg->upstream_sasl_password_file)) {
		snprintf(err, errlen, "upstream_sasl_mechanism OAUTHBEARER takes no user name or password: set "
			 "upstream_sasl_oauthbearer_token_endpoint_url");
		return KM_ERR_CONFIG;
	}
	if (mechanism_is(cfg, "OAUTHBEARER") && !cfg->upstream_sasl_oauthbearer_token_command &&
	    !km_secret_url_file(cfg->upstream_sasl_oauthbearer_token_endpoint_url) && !token_endpoint(cfg)) {
		snprintf(err, errlen, "upstream_sasl_mechanism OAUTHBEARER needs upstream_sasl_oauthbearer_token_endpoint_url "
			 "file:///PATH/TO/TOKEN (a file holding the token) or http(s)://HOST/PATH (a token endpoint), or "
			 "upstream_sasl_oauthbearer_token_command");
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_oauthbearer_client_secret && cfg->upstream_sasl_oauthbearer_client_secret_file &&
	    !cfg->upstream_sasl_oauthbearer_client_secret_from_file) {
		snprintf(err, errlen, "upstream_sasl_oauthbearer_client_secret and _client_secret_file: set one of them, "
			 "not both");
		return KM_ERR_CONFIG;
	}
	if (token_endpoint(cfg) != (cfg->upstream_sasl_oauthbearer_client_id != NULL) ||
	    token_endpoint(cfg) != (cfg->upstream_sasl_oauthbearer_client_secret != NULL ||
				    cfg->upstream_sasl_oauthbearer_client_secret_file != NULL) ||
	    (!token_endpoint(cfg) && cfg->upstream_sasl_oauthbearer_scope)) {
		snprintf(err, errlen, "upstream_sasl_oauthbearer_token_endpoint_url http(s)://... goes with "
			 "upstream_sasl_oauthbearer_client_id and _client_secret (or _client_secret_file), and those and "
			 "_scope with it only");
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_mechanism && !mechanism_is(cfg, "GSSAPI") && !mechanism_is(cfg, "OAUTHBEARER") &&
	    !cfg->upstream_sasl_username) {
		snprintf(err, errlen, "upstream_sasl_mechanism needs upstream_sasl_username");
		return KM_ERR_CONFIG;
	}
	if ((cfg->upstream_sasl_kerberos_keytab != NULL) != (cfg->upstream_sasl_kerberos_principal != NULL)) {
		snprintf(err, errlen, "upstream_sasl_kerberos_keytab and upstream_sasl_kerberos_principal must be set "
			 "together (or neither: the default credentials cache)");
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_kerberos_keytab &&
	    (!cfg->upstream_sasl_mechanism || strcmp(cfg->upstream_sasl_mechanism, "GSSAPI") != 0)) {
		snprintf(err, errlen, "upstream_sasl_kerberos_keytab is for upstream_sasl_mechanism GSSAPI");
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_mechanism && !strcmp(cfg->upstream_sasl_mechanism, "GSSAPI") &&
	    (cfg->upstream_sasl_password || cfg->upstream_sasl_password_file)) {
		snprintf(err, errlen, "upstream_sasl_mechanism GSSAPI takes no password: set upstream_sasl_kerberos_keytab "
			 "and upstream_sasl_kerberos_principal");
		return KM_ERR_CONFIG;
	}
	if (!cfg->upstream_tls && (cfg->upstream_tls_ca_file || cfg->upstream_tls_cert_file ||
				   cfg->upstream_tls_keystore_file || cfg->upstream_tls_truststore_file)) {
		snprintf(err, errlen, "upstream_tls_* files are set but upstream_tls is false");
		return KM_ERR_CONFIG;
	}
	return KM_OK;
}

#define PASSWORD_FILE_MAX 4096
#define KEYTAB_FILE_MAX (1024 * 1024)

/* A secret file kmirrord's libraries read themselves (a keytab, a token): read here only to check it. */
static km_err check_secret_file(const char *option, const char *path, const km_config *cfg, char *err,
				size_t errlen)
{
	uint8_t *buf = malloc(KEYTAB_FILE_MAX);
	size_t len;
	bool loose;
	km_err rc;

	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return KM_ERR_NOMEM;
	}
	rc = km_secret_file_read(option, path, cfg->secret_file_mode_check, buf, KEYTAB_FILE_MAX, &len, &loose, err,
				 errlen);
	explicit_bzero(buf, KEYTAB_FILE_MAX);
	free(buf);
	if (rc != KM_OK)
		return KM_ERR_CONFIG;
	if (loose)
		KM_WARN("config", 0, "%s", err);
	return KM_OK;
}

/*
 * A secret of one line from the file option file_opt names into *value (its earlier value wiped);
 * *from_file set. Nothing when there is no file or it was read already.
 */
static km_err read_secret_line(const char *file_opt, const char *path, bool mode_check, char **value,
			       bool *from_file, char *err, size_t errlen)
{
	uint8_t buf[PASSWORD_FILE_MAX];
	size_t len;
	bool loose;
	char *v;

	if (!path || *from_file)
		return KM_OK;
	if (km_secret_file_read(file_opt, path, mode_check, buf, sizeof(buf), &len, &loose, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (loose)
		KM_WARN("config", 0, "%s", err);
	if (len > 0 && buf[len - 1] == '\n')
		len--;
	if (len > 0 && buf[len - 1] == '\r')
		len--;
	if (len == 0 || memchr(buf, 0, len)) {
		snprintf(err, errlen, "%s %s: %s", file_opt, path, len ? "holds a NUL byte" : "is empty");
		explicit_bzero(buf, sizeof(buf));
		return KM_ERR_CONFIG;
	}
	v = strndup((const char *)buf, len);
	explicit_bzero(buf, sizeof(buf)); /* not OPENSSL_cleanse: src/core does without OpenSSL */
	if (!v) {
		snprintf(err, errlen, "out of memory");
		return KM_ERR_NOMEM;
	}
	if (*value)
		explicit_bzero(*value, strlen(*value));
	free(*value);
	*value = v;
	*from_file = true;
	return KM_OK;
}

km_err km_config_read_secrets(km_config *cfg, char *err, size_t errlen)
{
	const char *token_file = km_secret_url_file(cfg->upstream_sasl_oauthbearer_token_endpoint_url);
	km_err rc;

	/* A keytab's keys and a bearer token log in as kmirrord as well as a password does: the same mode rule. */
	if (cfg->upstream_sasl_kerberos_keytab &&
	    check_secret_file("upstream_sasl_kerberos_keytab", cfg->upstream_sasl_kerberos_keytab, cfg, err, errlen) !=
		    KM_OK)
		return KM_ERR_CONFIG;
	if (mechanism_is(cfg, "OAUTHBEARER") && token_file &&
	    check_secret_file("upstream_sasl_oauthbearer_token_endpoint_url", token_file, cfg, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	rc = read_secret_line("upstream_sasl_password_file", cfg->upstream_sasl_password_file,
			      cfg->secret_file_mode_check, &cfg->upstream_sasl_password,
			      &cfg->upstream_sasl_password_from_file, err, errlen);
	if (rc != KM_OK)
		return rc;
	return read_secret_line("upstream_sasl_oauthbearer_client_secret_file",
				cfg->upstream_sasl_oauthbearer_client_secret_file, cfg->secret_file_mode_check,
				&cfg->upstream_sasl_oauthbearer_client_secret,
				&cfg->upstream_sasl_oauthbearer_client_secret_from_file, err, errlen);
}

km_err km_config_check_reload(const km_config *cur, const km_config *next, char *err, size_t errlen)
{
	km_err rc = km_config_validate(next, err, errlen);
	if (rc != KM_OK)
		return rc;
	return km_opt_check_reload(&table, cur, next, err, errlen);
}

/* ---- --check-config: the files the options name, and what is valid but likely wrong ---- */

/* How kmirrord uses a path: reads the file, reads the directory, or writes a file there (and reads it back). */
typedef enum { PATH_FILE, PATH_DIR, PATH_WRITTEN } path_use;

static const struct {
	const char *option;
	path_use use;
} path_options[] = {
	{"admin_tls_cert_file", PATH_FILE},    {"admin_tls_key_file", PATH_FILE},
	{"admin_token_file", PATH_FILE},       {"upstream_file", PATH_WRITTEN},
	{"tls_cert_file", PATH_FILE},          {"tls_key_file", PATH_FILE},
	{"tls_ca_file", PATH_FILE},            {"upstream_tls_ca_file", PATH_FILE},
	{"upstream_tls_cert_file", PATH_FILE}, {"upstream_tls_key_file", PATH_FILE},
	{"upstream_sasl_password_file", PATH_FILE}, {"mirror_secret_key_file", PATH_FILE},
	{"upstream_sasl_kerberos_keytab", PATH_FILE}, {"tls_keystore_file", PATH_FILE},
	{"upstream_sasl_oauthbearer_client_secret_file", PATH_FILE},
	{"tls_truststore_file", PATH_FILE},    {"upstream_tls_keystore_file", PATH_FILE},
	{"upstream_tls_truststore_file", PATH_FILE},
	{"mirror_file_dir", PATH_DIR},
};

/* Why path cannot be used as use says, into why; false when it can. */
static bool path_problem(const char *path, path_use use, char *why, size_t len)
{
	struct stat st;
	char dir[4096];
	int fd;

	if (use == PATH_WRITTEN) {
		/* Written by a swap (a temporary file beside it, then a rename); absent until the first one. */
		snprintf(dir, sizeof(dir), "%s", path);
		if (access(dirname(dir), W_OK | X_OK) != 0) {
			snprintf(why, len, "its directory %s: %s (a swap writes the file there)", dir, strerror(errno));
			return true;
		}
		if (access(path, F_OK) != 0 && errno == ENOENT)
			return false;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (use == PATH_DIR ? O_DIRECTORY : 0));
	if (fd < 0) {
		snprintf(why, len, "%s", strerror(errno));
		return true;
	}
	if (use != PATH_DIR && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
		snprintf(why, len, "is a directory, not a file");
		close(fd);
		return true;
	}
	close(fd);
	return false;
}

int km_config_check_files(const km_config *cfg, char *out, size_t outlen)
{
	size_t n = 0;
	int problems = 0;

	if (outlen)
		out[0] = '\0';
	for (size_t i = 0; i < sizeof(path_options) / sizeof(path_options[0]); i++) {
		const km_option *o = km_opt_find(&table, path_options[i].option);
		const char *path = *(char *const *)((const char *)cfg + o->offset);
		char why[4200];
		if (!path || !path_problem(path, path_options[i].use, why, sizeof(why)))
			continue;
		problems++;
		if (n < outlen)
			n += (size_t)snprintf(out + n, outlen - n, "%s%s %s: %s", n ? "\n" : "", o->name, path, why);
	}
	return problems;
}

/* localhost, 127.0.0.0/8, ::1 (and ::ffff:127.x): the host itself, whoever resolves it. */
static bool loopback_host(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;
	size_t len = strlen(host);

	if (!strcasecmp(host, "localhost") || (len > 10 && !strcasecmp(host + len - 10, ".localhost")))
		return true;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
	return false;
}

bool km_config_loopback_warning(const km_config *cfg, char *buf, size_t len)
{
	char listen[300];

	if (!cfg->advertised_host || !loopback_host(cfg->advertised_host) || loopback_host(cfg->listen.host))
		return false;
	km_hostport_format(&cfg->listen, listen, sizeof(listen));
	snprintf(buf, len, "advertised_host %s is a loopback address but listen %s takes connections from other hosts: "
		 "clients elsewhere would be sent to themselves for every broker; set advertised_host to a name they "
		 "reach this host at (loopback is right only when every client runs on this host, or reaches it through "
		 "ports published there, as from a container)", cfg->advertised_host, listen);
	return true;
}

/* ---- the upstream swap's file ---- */

void km_config_format_upstream(const km_hostport *list, int count, char *buf, size_t len)
{
	size_t n = 0;
	if (len)
		buf[0] = '\0';
	for (int i = 0; i < count && n + 1 < len; i++) {
		char one[300];
		km_hostport_format(&list[i], one, sizeof(one));
		n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "," : "", one);
	}
}

km_err km_config_apply_upstream_file(km_config *cfg, char *err, size_t errlen)
{
	/* The file is read by the config file's own parser, with a table of the one option it may hold. */
	const km_opt_table one = {km_opt_find(&table, "upstream"), 1, sizeof(km_config)};
	km_config work;
	char sub[512];
	km_err rc;

	if (!cfg->upstream_file || (access(cfg->upstream_file, F_OK) != 0 && errno == ENOENT))
		return KM_OK;
	/* A shallow copy is safe: the one-row table owns no strings. Count 0 tells a file without the line. */
	work = *cfg;
	work.upstream_count = 0;
	if ((rc = km_opt_load_file(&one, &work, cfg->upstream_file, sub, sizeof(sub))) != KM_OK) {
		snprintf(err, errlen, "upstream_file %s (it holds only 'upstream = HOST:PORT,...')", sub);
		return rc;
	}
	if (work.upstream_count == 0) {
		snprintf(err, errlen, "upstream_file %s: no 'upstream = HOST:PORT,...' line (delete the file to use the "
			 "upstream option)", cfg->upstream_file);
		return KM_ERR_CONFIG;
	}
	memcpy(cfg->upstream, work.upstream, sizeof(cfg->upstream));
	cfg->upstream_count = work.upstream_count;
	return KM_OK;
}

km_err km_config_write_upstream_file(const char *path, const km_hostport *list, int count, char *err, size_t errlen)
{
	char tmp[4096], text[4096], dir[4096];
	int fd, dfd;
	size_t len, done = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
		snprintf(err, errlen, "upstream_file: path too long");
		return KM_ERR_INVAL;
	}
	km_config_format_upstream(list, count, text + 11, sizeof(text) - 12);
	memcpy(text, "upstream = ", 11);
	len = strlen(text);
	text[len++] = '\n';
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
		return KM_ERR_IO;
	}
	while (done < len) {
		ssize_t n = write(fd, text + done, len - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		done += (size_t)n;
	}
	if (done < len || fsync(fd) != 0) {
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
		close(fd);
		unlink(tmp);
		return KM_ERR_IO;
	}
	close(fd);
	if (rename(tmp, path) != 0) {
		snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
		unlink(tmp);
		return KM_ERR_IO;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		(void)fsync(dfd);
		close(dfd);
	}
	return KM_OK;
}
