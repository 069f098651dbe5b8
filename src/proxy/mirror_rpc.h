/* Proxy-internal: the mirror RPCs (api keys 32000-32009) and the mirror.name topic config, answered by the proxy from the state store. */
#ifndef KMIRROR_PROXY_MIRROR_RPC_H
#define KMIRROR_PROXY_MIRROR_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/arena.h"
#include "kmirror/error.h"
#include "kmirror/msg/alter_configs_request.h"
#include "kmirror/msg/alter_configs_response.h"
#include "kmirror/msg/describe_configs_request.h"
#include "kmirror/msg/describe_configs_response.h"
#include "kmirror/msg/incremental_alter_configs_request.h"
#include "kmirror/msg/incremental_alter_configs_response.h"
#include "kmirror/wire.h"
#include "proxy/apis.h"
#include "proxy/session.h"

/* The topic config that names a topic's mirror (the proposal's), and its suffixes. */
#define KM_MIRROR_NAME_CONFIG "mirror.name"
#define KM_MIRROR_PAUSED_SUFFIX ".paused"
#define KM_MIRROR_REMOVED_SUFFIX ".removed"
/* The state topic's name when there is no store to ask (km_state_topic_name_of_store). */
#define KM_MIRROR_STATE_TOPIC_DEFAULT "__mirror_state"

/* Kafka's config resource types and config sources (the wire values). */
enum { KM_RESOURCE_TOPIC = 2, KM_RESOURCE_BROKER = 4 };
enum { KM_CONFIG_SOURCE_DYNAMIC_TOPIC = 1 };
/* ACL filter fields of the ALTER-on-CLUSTER probe (the wire values). */
enum { KM_ACL_PATTERN_LITERAL = 3, KM_ACL_OPERATION_ALTER = 7, KM_ACL_PERMISSION_DENY = 2 };
/* The mirror option that turns the ACL sync on (docs/mirror.md, "Metadata sync"). */
#define KM_MIRROR_ACL_INCLUDE "mirror.acl.include"

/*
 * The stages (km_mirror_rpc_feature, apis.h): the ten RPCs (LOCAL), and IncrementalAlterConfigs,
 * AlterConfigs and DescribeConfigs (HOLD: mirror.name is the proxy's; everything else goes to the
 * broker).
 */
/*
 * The sessions of set are going away with the proxy: mirror operations still waiting for the
 * store drop their answers instead of looking for the set (called before it is freed).
 */
void km_mirror_rpc_detach(km_session_set *set);

/* ---- the pure parts (mirror_cfg.c): request checks, the mirror.name split and merge ---- */

/*
 * A mirror or topic name as Kafka checks a topic name: not empty, at most 249 characters, only
 * ASCII letters, digits, '.', '_' and '-', not "." or "..". what is "topic" or "mirror" (in the
 * message). A mirror name may not end in .paused or .removed (mirror.name gives them meaning).
 * KM_OK, or INVALID_REQUEST with err saying why.
 */
km_err km_mirror_check_name(km_str name, const char *what, char *err, size_t errlen);
/* Every name valid and none twice (names[i], n of them). */
/*
 * The first of n strings (each a km_str at offset off of a stride-byte struct) equal to an earlier
 * one: *dup its index, n when none. Linear: a request's names are checked before it is authorized.
 */
km_err km_str_first_dup(const void *items, size_t n, size_t stride, size_t off, size_t *dup);
km_err km_mirror_check_names(const km_str *names, size_t n, const char *what, char *err, size_t errlen);

/* What a resource's mirror.name asks for. */
typedef enum {
	KM_MCFG_NONE = 0, /* no mirror.name: the broker's alone */
	KM_MCFG_SET,      /* "m": start from m, or resume when PAUSED in m */
	KM_MCFG_PAUSE,    /* "m.paused" */
	KM_MCFG_STOP,     /* "m.removed", or the config deleted (mirror empty: the topic's own) */
} km_mcfg_kind;

/* One resource of an IncrementalAlterConfigs / AlterConfigs request, as the split sees it. */
typedef struct km_mcfg_res {
	km_mcfg_kind kind;
	km_str mirror;     /* the mirror the value names; len 0 when deleted */
	int32_t fwd;       /* index in the forwarded request; -1: not forwarded */
	int32_t auth;      /* AlterConfigs: index in the authorizing probe; -1: none */
	int16_t code;      /* the outcome so far (the broker's, then the mirror operation's) */
	km_str message;    /* null when code is 0 */
} km_mcfg_res;

typedef struct km_mcfg_split {
	bool mine;            /* some resource has mirror.name or is the state topic: the proxy answers */
	int32_t nres;
	km_mcfg_res *res;     /* one per resource of the request, in order */
	/* IncrementalAlterConfigs: the request forwarded (mirror.name removed, state topic left out). */
	km_incremental_alter_configs_request fwd;
	/* AlterConfigs: the request forwarded (resources left with configs), and the authorizing
	 * IncrementalAlterConfigs (ValidateOnly, no configs) for the resources not forwarded. */
	km_alter_configs_request fwd_legacy;
	km_incremental_alter_configs_request auth;
} km_mcfg_split;

/*
 * The topics a client may not reconfigure: the state topic at all; a mirror topic that is not
 * STOPPED in anything but mirror.name (its configs follow the source's through the metadata sync,
 * and a config such as retention.ms deletes records as a refused DeleteRecords would).
 */
typedef struct km_mcfg_guard {
	const char *state_topic;
	/* Whether topic's configs belong to the metadata sync; if so, msg says so (for the client). */
	bool (*synced)(void *arg, km_str topic, char *msg, size_t len);
	void *arg;
	int16_t code; /* the refusal of a synced topic's configs (read_only_error) */
} km_mcfg_guard;

/* Split a request; arrays and strings of out come from a (strings may borrow in's). */
km_err km_mcfg_split_iac(const km_incremental_alter_configs_request *in, const km_mcfg_guard *g, km_arena *a,
			 km_mcfg_split *out);
km_err km_mcfg_split_ac(const km_alter_configs_request *in, const km_mcfg_guard *g, km_arena *a,
			km_mcfg_split *out);
/*
 * The broker's answer to the forwarded request (or to the authorizing probe: auth true) becomes
 * each resource's outcome; messages are copied into a. KM_ERR_DECODE when it does not answer the
 * resources sent, in order.
 */
km_err km_mcfg_take_iac(km_mcfg_split *sp, const km_incremental_alter_configs_response *r, bool auth, km_arena *a);
km_err km_mcfg_take_ac(km_mcfg_split *sp, const km_alter_configs_response *r, km_arena *a);
/* Set resource i's outcome (message copied into a; NULL with code 0). */
void km_mcfg_set(km_mcfg_split *sp, int32_t i, int16_t code, const char *message, km_arena *a);
/* The client's response: one result per resource of the request, in its order. */
km_err km_mcfg_merge_iac(const km_incremental_alter_configs_request *in, const km_mcfg_split *sp, km_arena *a,
			 km_incremental_alter_configs_response *out);
km_err km_mcfg_merge_ac(const km_alter_configs_request *in, const km_mcfg_split *sp, km_arena *a,
			km_alter_configs_response *out);

/* A mirror topic's mirror.name value ("m", "m.paused", "m.removed") into value; false: not a mirror topic. */
typedef bool (*km_mcfg_lookup)(void *arg, km_str topic, char *value, size_t cap);
/* Whether a DescribeConfigs resource asks for mirror.name (a topic, keys null or naming it). */
bool km_mcfg_describe_wants(const km_describe_configs_request_describe_configs_resource *r);
/*
 * Add the synthesized mirror.name entry to each successful TOPIC result named in topics (n) that
 * look says is a mirror topic: read-only, DYNAMIC_TOPIC_CONFIG, STRING, with itself as its one
 * synonym when synonyms were asked for. Returns how many were added in *added.
 */
km_err km_mcfg_describe_add(km_describe_configs_response *m, const km_str *topics, size_t n, bool synonyms,
			    km_mcfg_lookup look, void *arg, km_arena *a, int *added);

#endif
