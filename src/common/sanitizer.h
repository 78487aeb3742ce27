/* sanitizer.h -- what code that the sanitizers cannot follow tells them */
#ifndef MOAT_SANITIZER_H
#define MOAT_SANITIZER_H

#if defined(__SANITIZE_THREAD__)
#define MOAT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MOAT_TSAN 1
#endif
#endif
#ifdef MOAT_TSAN
void __tsan_ignore_thread_begin(void);
#endif

/* Call first in the child of a raw clone3 (a new process, no CLONE_VM). ThreadSanitizer sees
 * fork(), not clone3: it takes the child for the calling thread of the parent and reports every
 * fd the child dups or closes, last touched by another of the parent's threads, as a race. The
 * child only arranges its fds and execs: it is not watched. Does nothing in other builds. */
static inline void moat_sanitizer_clone_child(void) {
#ifdef MOAT_TSAN
  __tsan_ignore_thread_begin();
#endif
}

#endif
