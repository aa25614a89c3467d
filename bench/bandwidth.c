/* Memory read bandwidth: sum a buffer much larger than the caches, on N threads.
 * The loop is plain C so that -O3 -march=native turns it into the widest vector loads the CPU has;
 * the sum is returned so that the compiler cannot drop the reads. */
#include <stddef.h>
#include <stdint.h>

uint64_t lm_read_words(const uint64_t *words, size_t count, int threads) {
    uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
    for (size_t i = 0; i < count; i++) {
        total += words[i];
    }
    return total;
}
