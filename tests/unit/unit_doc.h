/* Unit test helper: check that a page under docs/ shows generated text verbatim between two markers. */
#ifndef KMIRROR_UNIT_DOC_H
#define KMIRROR_UNIT_DOC_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fails the test (printing want and how to fix it) unless docs/page holds want between begin and end. */
static void assert_doc_shows(const char *page, const char *begin_marker, const char *end_marker, const char *want,
			     size_t want_len, const char *fix)
{
	const char *srcdir = getenv("srcdir");
	char path[1024], *doc, *begin, *end;
	size_t dlen;
	FILE *f;

	snprintf(path, sizeof(path), "%s/docs/%s", srcdir ? srcdir : ".", page);
	f = fopen(path, "r");
	assert_non_null(f);
	doc = calloc(1, 1 << 20);
	dlen = fread(doc, 1, (1 << 20) - 1, f);
	fclose(f);
	assert_true(dlen > 0);
	begin = strstr(doc, begin_marker);
	end = strstr(doc, end_marker);
	assert_non_null(begin);
	assert_non_null(end);
	begin += strlen(begin_marker);
	if ((size_t)(end - begin) != want_len || memcmp(begin, want, want_len) != 0) {
		fprintf(stderr, "docs/%s is out of date (%s); it should show:\n%.*s", page, fix, (int)want_len, want);
		fail();
	}
	free(doc);
}

#endif
