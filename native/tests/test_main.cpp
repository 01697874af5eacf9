#include <cstring>

#include "test.h"

int main(int argc, char **argv) {
    int failed_cases = 0, run = 0;
    for (const auto &c : dfltest::registry()) {
        if (argc > 1 && std::strstr(c.name, argv[1]) == nullptr) continue;
        const int before = dfltest::g_failures;
        try {
            c.fn();
        } catch (const std::exception &e) {
            std::printf("  exception: %s\n", e.what());
            dfltest::g_failures++;
        }
        run++;
        const bool ok = dfltest::g_failures == before;
        if (!ok) failed_cases++;
        std::printf("%s %s\n", ok ? "ok  " : "FAIL", c.name);
    }
    std::printf("%d tests, %d failed\n", run, failed_cases);
    return failed_cases == 0 && run > 0 ? 0 : 1;
}
