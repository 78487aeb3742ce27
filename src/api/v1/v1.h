/* v1.h -- the native v1 API's handlers (one file per resource) and its route table (routes.c) */
#ifndef MOAT_API_V1_H
#define MOAT_API_V1_H

#include "../http/http.h"

/* Handlers: called once the whole body is in; each queues exactly one reply. */
int api_h_healthz(struct api_req *r, json_t *body);
int api_h_host(struct api_req *r, json_t *body);
int api_h_sandboxes_list(struct api_req *r, json_t *body);
int api_h_sandboxes_create(struct api_req *r, json_t *body);
int api_h_sandbox_get(struct api_req *r, json_t *body);
int api_h_sandbox_patch(struct api_req *r, json_t *body);
int api_h_sandbox_delete(struct api_req *r, json_t *body);
int api_h_exec(struct api_req *r, json_t *body);
int api_h_files_get(struct api_req *r, json_t *body);
int api_h_files_delete(struct api_req *r, json_t *body);
int api_h_files_list(struct api_req *r, json_t *body);
int api_h_files_stat(struct api_req *r, json_t *body);
int api_h_files_mkdir(struct api_req *r, json_t *body);
int api_h_files_move(struct api_req *r, json_t *body);
int api_h_templates_list(struct api_req *r, json_t *body);
int api_h_template_build(struct api_req *r, json_t *body);
int api_h_template_get(struct api_req *r, json_t *body);
int api_h_template_delete(struct api_req *r, json_t *body);
int api_h_template_build_logs(struct api_req *r, json_t *body);
bool api_template_build_open(struct api_req *r);
bool api_template_import_open(struct api_req *r);
int api_template_upload_chunk(struct api_req *r, const char *data, size_t len, moat_error **err);
int api_template_build_finish(struct api_req *r);
int api_template_import_finish(struct api_req *r);

/* PUT files, streamed (the route's hooks): open before the body (true after queueing an error
 * reply), push each chunk (-1 with *err set: the connection is aborted with that error), finish at
 * the end. An unfinished upload is discarded with the request. */
bool api_files_put_open(struct api_req *r);
int api_files_put_chunk(struct api_req *r, const char *data, size_t len, moat_error **err);
int api_files_put_finish(struct api_req *r);

/* Volumes (volumes.c): the routes' handlers, and PUT .../files streamed as files.c's. */
int api_h_databases_create(struct api_req *r, json_t *body);
int api_h_databases_list(struct api_req *r, json_t *body);
int api_h_database_branch(struct api_req *r, json_t *body);
int api_h_audit(struct api_req *r, json_t *body);
int api_h_usage(struct api_req *r, json_t *body);
int api_sandbox_metrics_series(struct api_req *r);
int api_h_database_events(struct api_req *r, json_t *body);
int api_h_database_get(struct api_req *r, json_t *body);
int api_h_database_delete(struct api_req *r, json_t *body);
int api_h_me(struct api_req *r, json_t *body);
int api_h_keys_create(struct api_req *r, json_t *body);
int api_h_keys_list(struct api_req *r, json_t *body);
/* orgs.c */
int api_h_orgs_create(struct api_req *r, json_t *body);
int api_h_orgs_list(struct api_req *r, json_t *body);
int api_h_org_get(struct api_req *r, json_t *body);
int api_h_org_delete(struct api_req *r, json_t *body);
int api_h_org_quotas_get(struct api_req *r, json_t *body);
int api_h_org_quotas_put(struct api_req *r, json_t *body);
int api_h_org_usage(struct api_req *r, json_t *body);
int api_h_key_delete(struct api_req *r, json_t *body);
int api_h_volumes_create(struct api_req *r, json_t *body);
int api_h_volumes_list(struct api_req *r, json_t *body);
int api_h_volume_get(struct api_req *r, json_t *body);
int api_h_volume_delete(struct api_req *r, json_t *body);
int api_h_volume_files_get(struct api_req *r, json_t *body);
int api_h_volume_files_delete(struct api_req *r, json_t *body);
bool api_volume_put_open(struct api_req *r);
int api_volume_put_chunk(struct api_req *r, const char *data, size_t len, moat_error **err);
int api_volume_put_finish(struct api_req *r);

/* Streams, processes, the PTY WebSocket and watches (stream.c, procs.c, pty.c, files.c). */
int api_h_exec_stream(struct api_req *r, json_t *body);
int api_h_procs_list(struct api_req *r, json_t *body);
int api_h_proc_stdin(struct api_req *r, json_t *body);
int api_h_proc_signal(struct api_req *r, json_t *body);
int api_h_proc_resize(struct api_req *r, json_t *body);
int api_h_proc_stream(struct api_req *r, json_t *body);
int api_h_pty(struct api_req *r, json_t *body);
int api_h_files_watch(struct api_req *r, json_t *body);

/* GET .../events (v1/events.c) */
int api_h_events(struct api_req *r, json_t *body);
/* GET .../logs (v1/logs.c) */
int api_h_logs(struct api_req *r, json_t *body);

/* POST .../exec with background: true -> 201 {pid, tag}. body was parsed into req and x. */
int api_exec_background(struct api_req *r, struct moat_exec_req *req, const struct api_exec_extra *x);
/* The guest socket of the request's sandbox (caller frees) after control's org/state checks;
 * with env non-NULL also the sandbox env ("K=V", strv_free). NULL and *err on failure. */
struct moat_guest_ep *api_guest_sock(struct api_req *r, char ***env, moat_error **err);
/* Replies to a failed process operation: ESRCH 404 process_not_found, ENOTTY 400 not_a_tty,
 * EEXIST 409 tag_in_use, others as api_reply_moat_error. Frees *err. */
int api_reply_proc_error(struct api_req *r, moat_error **err);

/* Time travel (timetravel.c). */
int api_h_pause(struct api_req *r, json_t *body);
int api_h_resume(struct api_req *r, json_t *body);
int api_h_hibernate(struct api_req *r, json_t *body);
int api_h_wake(struct api_req *r, json_t *body);
int api_h_snapshot_create(struct api_req *r, json_t *body);
int api_h_fork(struct api_req *r, json_t *body);
int api_h_explore(struct api_req *r, json_t *body);
int api_h_rollback(struct api_req *r, json_t *body);
int api_h_snapshots_list(struct api_req *r, json_t *body);
/* Network policy and log (network.c). */
int api_h_network_get(struct api_req *r, json_t *body);
int api_h_network_put(struct api_req *r, json_t *body);
int api_h_network_log(struct api_req *r, json_t *body);
int api_h_snapshot_get(struct api_req *r, json_t *body);
int api_h_snapshot_delete(struct api_req *r, json_t *body);

/* The native v1 API (v1/routes.c). */
extern const struct api_front api_front_v1;

/* Code contexts (contexts.c, over control/contexts.c). */
int api_h_ctx_create(struct api_req *r, json_t *body);
int api_h_ctx_list(struct api_req *r, json_t *body);
int api_h_ctx_delete(struct api_req *r, json_t *body);
int api_h_ctx_restart(struct api_req *r, json_t *body);
int api_h_ctx_run(struct api_req *r, json_t *body);

/* Metrics (v1/metrics.c). */
int api_h_metrics(struct api_req *r, json_t *body);
int api_h_sandbox_metrics(struct api_req *r, json_t *body);

/* What a state transition means, as the events and logs routes name it (v1/events.c): created,
 * running (ready), paused, resumed, hibernated, woken, rolled_back, killed; else the new state's name. */
struct moat_sandbox_event;
const char *api_v1_transition_name(const struct moat_sandbox_event *ev);

/* Sandboxes list: state (NULL = any) and metadata.KEY=VALUE filters into *meta (owned, or NULL). */
int api_args_list_filter(const struct api_args *a, bool *has_state, enum moat_sandbox_state *state,
                         json_t **meta, moat_error **err);

#endif
