/* routes.c -- the native v1 API's route table: a route is one line here plus its handler */
#include "v1.h"

static const struct api_route_hooks files_put = {
    .begin = api_files_put_open, .body = api_files_put_chunk, .finish = api_files_put_finish};

static const struct api_route_hooks volume_put = {
    .begin = api_volume_put_open, .body = api_volume_put_chunk, .finish = api_volume_put_finish};

static const struct api_route_hooks template_post = {
    .begin = api_template_build_open, .body = api_template_upload_chunk, .finish = api_template_build_finish};

static const struct api_route_hooks template_import = {.begin = api_template_import_open,
                                                       .body = api_template_upload_chunk,
                                                       .finish = api_template_import_finish};

#define SB "/v1/sandboxes/{id}"

static const struct api_route_def v1_routes[] = {
    {"GET", "/healthz", "healthz", api_h_healthz, API_RT_PUBLIC, NULL},
    {"GET", "/metrics", "metrics", api_h_metrics, API_RT_ANY_KEY, NULL},
    {"GET", "/v1/host", "host", api_h_host, API_RT_ANY_KEY, NULL},

    {"GET", "/v1/me", "me", api_h_me, API_RT_ANY_KEY, NULL},
    {"GET", "/v1/orgs", "orgs.list", api_h_orgs_list, API_RT_PLATFORM, NULL},
    {"POST", "/v1/orgs", "orgs.create", api_h_orgs_create, API_RT_JSON | API_RT_PLATFORM, NULL},
    {"GET", "/v1/orgs/{sid}", "org.get", api_h_org_get, API_RT_PLATFORM, NULL},
    {"DELETE", "/v1/orgs/{sid}", "org.delete", api_h_org_delete, API_RT_PLATFORM, NULL},
    {"GET", "/v1/orgs/{sid}/quotas", "org.quotas.get", api_h_org_quotas_get, API_RT_ORG, NULL},
    {"PUT", "/v1/orgs/{sid}/quotas", "org.quotas.put", api_h_org_quotas_put, API_RT_JSON | API_RT_PLATFORM,
     NULL},
    {"GET", "/v1/orgs/{sid}/usage/now", "org.usage", api_h_org_usage, API_RT_ORG, NULL},
    {"GET", "/v1/audit", "audit", api_h_audit, 0, NULL},
    {"GET", "/v1/usage", "usage", api_h_usage, 0, NULL},
    {"GET", "/v1/keys", "keys.list", api_h_keys_list, API_RT_ADMIN, NULL},
    {"POST", "/v1/keys", "keys.create", api_h_keys_create, API_RT_JSON | API_RT_ADMIN, NULL},
    {"DELETE", "/v1/keys/{kid}", "key.delete", api_h_key_delete, API_RT_ADMIN | API_RT_SELF, NULL},

    {"GET", "/v1/sandboxes", "sandboxes.list", api_h_sandboxes_list, 0, NULL},
    {"POST", "/v1/sandboxes", "sandboxes.create", api_h_sandboxes_create, API_RT_JSON, NULL},
    {"GET", SB, "sandbox.get", api_h_sandbox_get, 0, NULL},
    {"PATCH", SB, "sandbox.patch", api_h_sandbox_patch, API_RT_JSON, NULL},
    {"DELETE", SB, "sandbox.delete", api_h_sandbox_delete, 0, NULL},

    {"POST", SB "/exec", "exec", api_h_exec, API_RT_JSON, NULL},
    {"POST", SB "/exec/stream", "exec.stream", api_h_exec_stream, API_RT_JSON | API_RT_STREAM, NULL},
    {"GET", SB "/processes", "processes.list", api_h_procs_list, 0, NULL},
    {"POST", SB "/processes/{proc}/stdin", "process.stdin", api_h_proc_stdin, API_RT_JSON, NULL},
    {"POST", SB "/processes/{proc}/signal", "process.signal", api_h_proc_signal, API_RT_JSON, NULL},
    {"POST", SB "/processes/{proc}/resize", "process.resize", api_h_proc_resize, API_RT_JSON, NULL},
    {"GET", SB "/processes/{proc}/stream", "process.stream", api_h_proc_stream, API_RT_STREAM, NULL},
    {"GET", SB "/pty", "pty", api_h_pty, API_RT_STREAM | API_RT_KEY_IN_QUERY, NULL},

    {"GET", SB "/files", "files.get", api_h_files_get, 0, NULL},
    {"PUT", SB "/files", "files.put", NULL, 0, &files_put},
    {"DELETE", SB "/files", "files.delete", api_h_files_delete, 0, NULL},
    {"GET", SB "/files/list", "files.list", api_h_files_list, 0, NULL},
    {"GET", SB "/files/stat", "files.stat", api_h_files_stat, 0, NULL},
    {"POST", SB "/files/mkdir", "files.mkdir", api_h_files_mkdir, API_RT_JSON, NULL},
    {"POST", SB "/files/move", "files.move", api_h_files_move, API_RT_JSON, NULL},
    {"GET", SB "/files/watch", "files.watch", api_h_files_watch, API_RT_STREAM, NULL},

    {"GET", SB "/contexts", "contexts.list", api_h_ctx_list, 0, NULL},
    {"POST", SB "/contexts", "contexts.create", api_h_ctx_create, API_RT_JSON, NULL},
    {"DELETE", SB "/contexts/{cid}", "contexts.delete", api_h_ctx_delete, 0, NULL},
    {"POST", SB "/contexts/{cid}/restart", "contexts.restart", api_h_ctx_restart, API_RT_JSON, NULL},
    {"POST", SB "/contexts/{cid}/run", "contexts.run", api_h_ctx_run, API_RT_JSON, NULL},

    {"POST", SB "/pause", "sandbox.pause", api_h_pause, API_RT_JSON, NULL},
    {"POST", SB "/resume", "sandbox.resume", api_h_resume, API_RT_JSON, NULL},
    {"POST", SB "/hibernate", "sandbox.hibernate", api_h_hibernate, API_RT_JSON, NULL},
    {"POST", SB "/wake", "sandbox.wake", api_h_wake, API_RT_JSON, NULL},
    {"POST", SB "/snapshots", "snapshots.create", api_h_snapshot_create, API_RT_JSON, NULL},
    {"POST", SB "/fork", "sandbox.fork", api_h_fork, API_RT_JSON, NULL},
    {"POST", SB "/explore", "sandbox.explore", api_h_explore, API_RT_JSON, NULL},
    {"POST", SB "/rollback", "sandbox.rollback", api_h_rollback, API_RT_JSON, NULL},
    {"GET", "/v1/snapshots", "snapshots.list", api_h_snapshots_list, 0, NULL},
    {"GET", "/v1/snapshots/{sid}", "snapshot.get", api_h_snapshot_get, 0, NULL},
    {"DELETE", "/v1/snapshots/{sid}", "snapshot.delete", api_h_snapshot_delete, 0, NULL},

    {"GET", SB "/network", "sandbox.network.get", api_h_network_get, 0, NULL},
    {"PUT", SB "/network", "sandbox.network.put", api_h_network_put, API_RT_JSON, NULL},
    {"GET", SB "/network/log", "sandbox.network.log", api_h_network_log, 0, NULL},
    {"GET", SB "/metrics", "sandbox.metrics", api_h_sandbox_metrics, 0, NULL},
    {"GET", SB "/events", "sandbox.events", api_h_events, API_RT_STREAM, NULL},
    {"GET", SB "/logs", "sandbox.logs", api_h_logs, API_RT_STREAM, NULL},

    {"GET", "/v1/templates", "templates.list", api_h_templates_list, 0, NULL},
    {"POST", "/v1/templates/{name}/build", "templates.build", api_h_template_build, 0, NULL},
    {"GET", "/v1/templates/{name}", "template.get", api_h_template_get, 0, NULL},
    {"POST", "/v1/templates/{name}", "template.create", NULL, 0, &template_post},
    {"DELETE", "/v1/templates/{name}", "template.delete", api_h_template_delete, 0, NULL},
    {"POST", "/v1/templates/{name}/import", "template.import", NULL, 0, &template_import},
    {"GET", "/v1/templates/{name}/builds/{sid}/logs", "template.build.logs", api_h_template_build_logs,
     API_RT_STREAM, NULL},

    {"GET", "/v1/volumes", "volumes.list", api_h_volumes_list, 0, NULL},
    {"POST", "/v1/volumes", "volumes.create", api_h_volumes_create, API_RT_JSON, NULL},
    {"GET", "/v1/volumes/{name}", "volume.get", api_h_volume_get, 0, NULL},
    {"DELETE", "/v1/volumes/{name}", "volume.delete", api_h_volume_delete, 0, NULL},
    {"GET", "/v1/volumes/{name}/files", "volume.files.get", api_h_volume_files_get, 0, NULL},
    {"PUT", "/v1/volumes/{name}/files", "volume.files.put", NULL, 0, &volume_put},
    {"DELETE", "/v1/volumes/{name}/files", "volume.files.delete", api_h_volume_files_delete, 0, NULL},

    {"GET", "/v1/databases", "databases.list", api_h_databases_list, 0, NULL},
    {"POST", "/v1/databases", "databases.create", api_h_databases_create, API_RT_JSON, NULL},
    {"GET", "/v1/databases/{sid}", "database.get", api_h_database_get, 0, NULL},
    {"DELETE", "/v1/databases/{sid}", "database.delete", api_h_database_delete, 0, NULL},
    {"POST", "/v1/databases/{sid}/branch", "database.branch", api_h_database_branch, API_RT_JSON, NULL},
    {"GET", "/v1/databases/{sid}/events", "database.events", api_h_database_events, API_RT_STREAM, NULL},
};

static void v1_routes_add(struct api_router *rt) { api_router_add(rt, v1_routes, ARRAY_SIZE(v1_routes)); }

const struct api_front api_front_v1 = {.name = "v1", .routes = v1_routes_add};
