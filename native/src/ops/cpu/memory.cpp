#include <cstdio>
#include <cstring>
#include <unistd.h>

#include "ops/cpu/cpu_ops.h"

namespace dfl {

// MemAvailable (free plus reclaimable) rather than free pages: a page cache full of the model file is not "used".
void host_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
    *free_bytes = 0;
    *total_bytes = 0;
    if (FILE *f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kb;
        while (std::fgets(line, sizeof line, f)) {
            if (std::sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total_bytes = kb * 1024ull;
            if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *free_bytes = kb * 1024ull;
        }
        std::fclose(f);
    }
    if (*total_bytes == 0) {
        const long page = sysconf(_SC_PAGESIZE), phys = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
        if (page > 0 && phys > 0) *total_bytes = (uint64_t)phys * (uint64_t)page;
        if (page > 0 && avail > 0) *free_bytes = (uint64_t)avail * (uint64_t)page;
    }
}

}  // namespace dfl
