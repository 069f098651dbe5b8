/* kmirror: the admin CLI for mirrors (speaks the mirror RPCs to kmirrord). */
#include <stdio.h>
#include <string.h>

#include "kmirror/version.h"

static void usage(FILE *out)
{
	fprintf(out, "usage: kmirror [--version] [--help]\n"
		     "Admin tool for kmirror: create, describe and control mirrors through kmirrord.\n");
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--version") == 0) {
			printf("kmirror %s\n", KM_VERSION);
			return 0;
		}
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		}
		fprintf(stderr, "kmirror: unknown option '%s' (try --help)\n", argv[i]);
		return 2;
	}
	usage(stderr);
	return 2;
}
