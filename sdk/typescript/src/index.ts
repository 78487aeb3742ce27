// @moat/sdk -- TypeScript client for moat's v1 API.
export { Sandbox } from './sandbox.js';
export type {
  SandboxInfo,
  SandboxState,
  CreateOptions,
  ListOptions,
  SandboxPage,
  ExecOptions,
  BackgroundExecOptions,
  ExecResult,
  ExecStreamOptions,
  ExploreBranch,
  ExploreOutcome,
  ExploreResult,
  SnapshotInfo,
} from './sandbox.js';
export { SandboxProcess, SIGNALS } from './process.js';
export type { ExitInfo, ProcessInfo, OutputCallback, SignalName, StreamOptions } from './process.js';
export { Files } from './files.js';
export { Admin, QUOTA_NAMES } from './orgs.js';
export type { OrgInfo, OrgCreated, Quotas, QuotaName, QuotaUsage } from './orgs.js';
export type { LogEntry, LogsOptions } from './logs.js';
export { Volume } from './volume.js';
export type { VolumeAttachment, VolumeMount } from './volume.js';
export { Database } from './database.js';
export type { DatabaseAttachment, DatabaseBranchOptions, DatabaseConnection, DatabaseCreateOptions, DatabaseState } from './database.js';
export type { EntryInfo, FsEvent, Watcher } from './files.js';
export { CodeContext } from './context.js';
export type { Execution, ExecutionError, Result, Language, RunCodeOptions } from './context.js';
export type { Pty, PtyOptions, PtyExit } from './pty.js';
export { Connection, DEFAULT_API_URL, sdkDispatcher } from './http.js';
export type { ConnectionOptions } from './http.js';
export {
  MoatError,
  InvalidRequestError,
  AuthenticationError,
  ForbiddenError,
  NotFoundError,
  ConflictError,
  TimeoutError,
  NotImplementedError,
  SandboxUnavailableError,
  CheckpointsUnavailableError,
  ConnectionError,
} from './errors.js';
export { Template, BuildError, BuildLogs, contextTar } from './template.js';
export type { TemplateData, BuildLogLine, BuildEnd, BuildOptions } from './template.js';
export { health, listTemplates, buildTemplate } from './admin.js';
export { Usage } from './usage.js';
export { Host } from './host.js';
export type { HostInfo } from './host.js';
export type { UsageRow, UsagePoint, UsageOptions, MetricsRange, MetricsSample, TimeArg } from './usage.js';
export type { Health, TemplateInfo } from './admin.js';
export { SandboxEvents } from './sandbox_ops.js';
export type { PortAccess, NetworkPolicy, NetworkState, NetworkLogEntry, SandboxEvent } from './sandbox_ops.js';
export { Keys, Audit } from './account.js';
export type { KeyInfo, KeyRole, Me, AuditEntry, AuditQuery } from './account.js';
