/* Unit test helper: a temporary file with the given text (the caller unlinks and frees the path). */
#ifndef KMIRROR_UNIT_TMPFILE_H
#define KMIRROR_UNIT_TMPFILE_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *write_tmp(const char *text)
{
	char *path = strdup("/tmp/km-unit-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

#endif
