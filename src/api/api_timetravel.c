/* api_timetravel.c -- pause/resume, hibernate/wake, snapshots, fork, explore, rollback (issue 4)
 *
 * Until issue 4 lands every route answers 501 not_implemented. */
#include "api_internal.h"

static int not_yet(struct api_req *r) {
  return api_reply_error(r, 501, "not_implemented", "%s is not supported yet", api_route_name(r->route.kind));
}

int api_h_pause(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_resume(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_hibernate(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_wake(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_snapshot_create(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_fork(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_explore(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_rollback(struct api_req *r, json_t *body) { (void)body; return not_yet(r); }
int api_h_snapshots_list(struct api_req *r) { return not_yet(r); }
int api_h_snapshot_get(struct api_req *r) { return not_yet(r); }
int api_h_snapshot_delete(struct api_req *r) { return not_yet(r); }
