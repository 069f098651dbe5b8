/* kmirror version string (from configure). */
#ifndef KMIRROR_VERSION_H
#define KMIRROR_VERSION_H
#include "config.h"
#define KM_VERSION PACKAGE_VERSION
#endif
