// ThreadSanitizer suppressions for the example trainers' gloo communicators (cpp_trainer's
// GlooDataParallel, megatron_like's MegatronGroups), linked into both.
//
// When a gloo collective fails, it frees its own scratch memory and temporary transport buffers
// while gloo's I/O thread may still be completing a transfer into them: a race in gloo's error path,
// inside the collective, that no caller can prevent (the buffers the communicators own are kept
// until their destructors have closed every connection). The suppressions cover reports with the
// I/O thread's receive (Pair::read) or a gloo UnboundBuffer member on either stack, so TSan builds
// of the fault tests stay meaningful for everything else.
#if defined(__SANITIZE_THREAD__)
#define CPP_TRAINER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CPP_TRAINER_TSAN 1
#endif
#endif
#ifdef CPP_TRAINER_TSAN
extern "C" const char* __tsan_default_suppressions() {
  return "race:gloo::transport::tcp::UnboundBuffer::\n"
         "race:gloo::transport::tcp::Pair::read\n";
}
#endif
