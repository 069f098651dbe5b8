/*
 * libFuzzer harness: the kmirror CLI's --command-config (src/cli/props.c): Java .properties text
 * parsed, then read as Kafka tool client properties (TLS files, SASL from sasl.* or a
 * sasl.jaas.config line); and a sasl.jaas.config value on its own.
 *
 * Input: a mode byte (even: a properties file; odd: a JAAS line), then the text.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what)
{
	fprintf(stderr, "fuzz_props: %s\n", what);
	abort();
}

static void props(const char *text, size_t len)
{
	km_cli_kvs kv = {0};
	km_cli_client c;
	char err[512], warn[512];

	if (km_cli_props_parse(text, len, &kv, err, sizeof(err)) == KM_OK) {
		for (size_t i = 0; i < kv.count; i++) {
			if (!kv.items[i].name || !kv.items[i].value)
				die("a property without a name or a value");
			/* A later one replaced an earlier one of the same name: each name once. */
			if (km_cli_kvs_get(&kv, kv.items[i].name) != &kv.items[i])
				die("a property listed twice");
		}
		if (km_cli_client_from_props(&kv, &c, err, sizeof(err), warn, sizeof(warn)) == KM_OK) {
			if (c.sasl && (!c.sasl_mechanism || !c.username || !c.password))
				die("SASL without a mechanism or credentials");
			if ((c.cert_file != NULL) != (c.key_file != NULL))
				die("a certificate without its key");
			km_cli_client_free(&c);
		}
	}
	km_cli_kvs_free(&kv);
}

static void jaas(const char *text)
{
	char *user = NULL, *pass = NULL, err[512];
	const char *mech = NULL;
	if (km_cli_jaas_parse(text, &user, &pass, &mech, err, sizeof(err)) == KM_OK) {
		if (!user || !pass || !mech)
			die("a JAAS line accepted without its username, password or module");
	} else if (user || pass) {
		die("a refused JAAS line left credentials behind");
	}
	free(user);
	free(pass);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text;

	if (size < 1 || size > (1u << 20))
		return 0;
	/* A NUL-terminated copy of exactly the text (the JAAS parser reads a C string). */
	if (!(text = malloc(size)))
		return 0;
	memcpy(text, data + 1, size - 1);
	text[size - 1] = '\0';
	if (data[0] & 1)
		jaas(text);
	else
		props(text, size - 1);
	free(text);
	return 0;
}
