/* Test support: a throw-away self-signed certificate for localhost, made with the openssl tool. */
#ifndef KMIRROR_TEST_TLS_CERT_H
#define KMIRROR_TEST_TLS_CERT_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/*
 * Create dir from its mkdtemp template ("/tmp/km-XXXXXX") with cert.pem and key.pem (P-256, CN and
 * SAN localhost) in it; false when the openssl tool is missing or fails.
 */
static inline bool km_test_make_cert(char *dir)
{
	char cmd[512];
	if (!mkdtemp(dir))
		return false;
	snprintf(cmd, sizeof(cmd),
		 "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost "
		 "-addext subjectAltName=DNS:localhost -keyout %s/key.pem -out %s/cert.pem >/dev/null 2>&1",
		 dir, dir);
	return system(cmd) == 0;
}

static inline void km_test_remove_cert(const char *dir)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

#endif
