// export.hpp: the symbol visibility of the embedding API. The library is built with hidden
// visibility, so only what carries DIST_API is part of its binary interface.
#pragma once

#if defined(DIST_BUILDING_API)
#define DIST_API __attribute__((visibility("default")))
#else
#define DIST_API
#endif
