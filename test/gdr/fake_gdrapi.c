/*
 * test/gdr/fake_gdrapi.c - a stand-in for gdrcopy's libgdrapi.so.2 over host memory, for
 * test_knobs: the "GPU" addresses it pins are host memory, and gdr_map returns the pinned address
 * itself, so that what the caller writes through the mapping shows at the address it pinned.
 * FAKE_GDRAPI_OPEN_FAILS=1 makes gdr_open fail as without the gdrdrv module;
 * fake_gdr_pinned() counts the pins not yet undone.
 */
#include <stdint.h>
#include <stdlib.h>

typedef struct {
  unsigned long h;
} gdr_mh_t;

static int opened;
static int pinned;
static int handle = 1; /* one pinned range at a time is all test_knobs asks for */
static unsigned long pinnedAddr;
static size_t pinnedSize;

void* gdr_open(void) {
  const char* fail = getenv("FAKE_GDRAPI_OPEN_FAILS");
  if (fail != NULL && fail[0] == '1') return NULL;
  opened++;
  return &handle;
}

int gdr_close(void* g) {
  if (g != &handle || opened == 0) return -1;
  opened--;
  return 0;
}

int gdr_pin_buffer(void* g, unsigned long addr, size_t size, uint64_t p2pToken, uint32_t vaSpace,
                   gdr_mh_t* mh) {
  (void)p2pToken, (void)vaSpace;
  if (g != &handle || pinned) return -1;
  pinned = 1;
  pinnedAddr = addr;
  pinnedSize = size;
  mh->h = 42;
  return 0;
}

int gdr_unpin_buffer(void* g, gdr_mh_t mh) {
  if (g != &handle || !pinned || mh.h != 42) return -1;
  pinned = 0;
  return 0;
}

int gdr_map(void* g, gdr_mh_t mh, void** va, size_t size) {
  if (g != &handle || !pinned || mh.h != 42 || size != pinnedSize) return -1;
  *va = (void*)pinnedAddr;
  return 0;
}

int gdr_unmap(void* g, gdr_mh_t mh, void* va, size_t size) {
  if (g != &handle || mh.h != 42 || va != (void*)pinnedAddr || size != pinnedSize) return -1;
  return 0;
}

int fake_gdr_pinned(void) {
  return pinned + opened;
}
