// Stand-in for the SDK's include/Genie/GenieCommon.h (tests only): only the version defines,
// which hexbundle reads to know the libGenie version genie-t2t-run must print.
#ifndef GENIE_COMMON_H
#define GENIE_COMMON_H

#define GENIE_API_VERSION_MAJOR 1
#define GENIE_API_VERSION_MINOR 14
#define GENIE_API_VERSION_PATCH 0

#endif
