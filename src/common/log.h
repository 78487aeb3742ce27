/* log.h -- leveled logging to stderr with timestamps */
#ifndef MOAT_LOG_H
#define MOAT_LOG_H

enum moat_log_level { MOAT_LOG_DEBUG = 0, MOAT_LOG_INFO, MOAT_LOG_WARN, MOAT_LOG_ERROR };

void moat_log_set_level(enum moat_log_level level);
void moat_log(enum moat_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) moat_log(MOAT_LOG_DEBUG, __VA_ARGS__)
#define log_info(...) moat_log(MOAT_LOG_INFO, __VA_ARGS__)
#define log_warn(...) moat_log(MOAT_LOG_WARN, __VA_ARGS__)
#define log_error(...) moat_log(MOAT_LOG_ERROR, __VA_ARGS__)

#endif
