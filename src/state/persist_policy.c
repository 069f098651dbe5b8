/* __mirror_state's cleanup.policy checked (DescribeConfigs) before it is read or written: compacted, or refused. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/describe_configs_request.h"
#include "kmirror/msg/describe_configs_response.h"
#include "state/persist_int.h"

#define K_RESOURCE_TOPIC 2

bool km_state_policy_compacted(const char *policy)
{
	bool compact = false, other = false;
	const char *p = policy;

	/* A list: "compact", "delete", "compact,delete", spaces allowed around the names (as Kafka's parser). */
	while (p && *p) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		while (n && isspace((unsigned char)*p)) {
			p++;
			n--;
		}
		while (n && isspace((unsigned char)p[n - 1]))
			n--;
		if (n == 7 && !strncmp(p, "compact", 7))
			compact = true;
		else if (n)
			other = true;
		p = e ? e + 1 : NULL;
	}
	return compact && !other;
}

void km_state_policy_message(const char *topic, const char *policy, char *buf, size_t len)
{
	const char *why = "it is not compacted";

	if (policy && strstr(policy, "compact"))
		why = "its delete part would still expire every mirror after retention.ms";
	else if (policy && strstr(policy, "delete"))
		why = "delete would expire every mirror after retention.ms";
	snprintf(buf, len,
		 "%s has cleanup.policy=%s: kmirrord keeps its state there only in a compacted topic (%s); fix it with "
		 "kafka-configs --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact, or "
		 "point mirror_state_topic at another topic",
		 topic, policy && *policy ? policy : "(empty)", why, topic);
}

/* The policy of the one result, in policy (len bytes); false with why when the answer does not say it. */
static bool take_policy(km_state_persist *io, const km_describe_configs_response *r, char *policy, size_t len,
			char *why, size_t wlen)
{
	const km_describe_configs_response_describe_configs_result *res;

	if (r->results.count != 1) {
		snprintf(why, wlen, "DescribeConfigs of %s: %d results", io->st->cfg.mirror_state_topic,
			 r->results.count);
		return false;
	}
	res = &r->results.items[0];
	if (res->error_code) {
		snprintf(why, wlen, "DescribeConfigs of %s: %s%s%.*s%s", io->st->cfg.mirror_state_topic,
			 km_err_name(res->error_code), res->error_message.len > 0 ? " (" : "",
			 res->error_message.len > 0 ? (int)res->error_message.len : 0,
			 res->error_message.p ? res->error_message.p : "", res->error_message.len > 0 ? ")" : "");
		return false;
	}
	for (int32_t i = 0; i < res->configs.count; i++) {
		const km_describe_configs_response_describe_configs_resource_result *c = &res->configs.items[i];
		if (!km_str_eq_c(c->name, "cleanup.policy"))
			continue;
		/* Null or too long to be a policy list: say so rather than guess. */
		if (c->value.len < 0 || (size_t)c->value.len >= len)
			break;
		memcpy(policy, c->value.p, (size_t)c->value.len);
		policy[c->value.len] = 0;
		return true;
	}
	snprintf(why, wlen, "DescribeConfigs of %s did not give its cleanup.policy", io->st->cfg.mirror_state_topic);
	return false;
}

static void on_describe(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	char policy[128], why[1024];

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		snprintf(why, sizeof(why), "DescribeConfigs: %s", km_err_name(rr->err));
		io->chk_fail(io, why);
		return;
	}
	if (rr->err != KM_OK) {
		io->chk_fail(io, "undecodable DescribeConfigs response");
		return;
	}
	if (!take_policy(io, rr->msg, policy, sizeof(policy), why, sizeof(why))) {
		io->chk_fail(io, why);
		return;
	}
	if (!km_state_policy_compacted(policy)) {
		km_state_policy_message(io->st->cfg.mirror_state_topic, policy, why, sizeof(why));
		io->chk_fatal(io, why);
		return;
	}
	KM_DEBUG(COMP, 0, "%s: cleanup.policy=%s (DescribeConfigs v%d)", io->st->cfg.mirror_state_topic, policy,
		 rr->version);
	io->chk_ok(io);
}

static void check_send(km_state_persist *io)
{
	km_describe_configs_request m;
	km_describe_configs_request_describe_configs_resource rs;
	km_str key = km_str_c("cleanup.policy");
	km_net_client *c = km_ps_any(io);
	int16_t ver = 0;
	km_err rc;
	char why[200];

	if (!km_ps_client_wait(io, c, KM_PS_ANY, check_send))
		return;
	if (c && km_net_client_ready(c) &&
	    (ver = km_ps_version_for(c, KM_API_DESCRIBE_CONFIGS, why, sizeof(why))) < 0) {
		io->chk_fail(io, why);
		return;
	}
	km_describe_configs_request_init(&m);
	km_describe_configs_request_describe_configs_resource_init(&rs);
	rs.resource_type = K_RESOURCE_TOPIC;
	rs.resource_name = km_str_c(io->st->cfg.mirror_state_topic);
	rs.configuration_keys.items = &key;
	rs.configuration_keys.count = 1;
	m.resources.items = &rs;
	m.resources.count = 1;
	rc = km_ps_send_req(io, c, KM_API_DESCRIBE_CONFIGS, ver, &m, on_describe, -1, -1);
	if (rc != KM_OK) {
		km_ps_drop(io, c);
		snprintf(why, sizeof(why), "DescribeConfigs: %s", km_err_name(rc));
		io->chk_fail(io, why);
	}
}

void km_ps_check_policy(km_state_persist *io, void (*ok)(km_state_persist *io),
			void (*fail)(km_state_persist *io, const char *why),
			void (*fatal)(km_state_persist *io, const char *message))
{
	io->chk_ok = ok;
	io->chk_fail = fail;
	io->chk_fatal = fatal;
	check_send(io);
}
