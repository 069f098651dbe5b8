/* Unit test helper: a keytab holding a random AES key for one principal, made with the krb5 library (no KDC). */
#ifndef KMIRROR_UNIT_KEYTAB_H
#define KMIRROR_UNIT_KEYTAB_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <krb5.h>

/* The keytab's path (the caller unlinks and frees it). */
static char *make_keytab(const char *principal)
{
	char *path = strdup("/tmp/km-unit-keytab-XXXXXX"), name[200];
	int fd = mkstemp(path);
	krb5_context kc;
	krb5_keytab kt;
	krb5_keytab_entry e;

	assert_true(fd >= 0);
	close(fd);
	unlink(path); /* krb5 writes a new file; an empty one is not a keytab */
	assert_int_equal(krb5_init_context(&kc), 0);
	snprintf(name, sizeof(name), "FILE:%s", path);
	assert_int_equal(krb5_kt_resolve(kc, name, &kt), 0);
	memset(&e, 0, sizeof(e));
	assert_int_equal(krb5_parse_name(kc, principal, &e.principal), 0);
	e.vno = 1;
	assert_int_equal(krb5_c_make_random_key(kc, ENCTYPE_AES256_CTS_HMAC_SHA1_96, &e.key), 0);
	assert_int_equal(krb5_kt_add_entry(kc, kt, &e), 0);
	krb5_free_keytab_entry_contents(kc, &e);
	krb5_kt_close(kc, kt);
	krb5_free_context(kc);
	return path;
}

#endif
