// validate.ts -- argument checks that run before any network call.
//
// Every public method checks its arguments at run time (JavaScript callers have no compiler to do
// it) and throws a TypeError naming the method and the argument. Unknown option keys are errors
// too, so that a typo (`ttl` for `ttlSeconds`) does not silently do nothing.

export function fail(where: string, msg: string): never {
  throw new TypeError(`${where}: ${msg}`);
}

export function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (v instanceof Uint8Array) return 'a Uint8Array';
  const t = typeof v;
  if (t === 'string') return `the string ${JSON.stringify((v as string).length > 40 ? (v as string).slice(0, 40) + '...' : v)}`;
  if (t === 'number') return `the number ${String(v)}`;
  return t === 'object' ? 'an object' : t;
}

/** Checks that opts is undefined or a plain object whose keys are all in `allowed`. Returns it or {}. */
export function options<T extends object>(where: string, opts: unknown, allowed: readonly string[]): Partial<T> {
  if (opts === undefined || opts === null) return {};
  if (typeof opts !== 'object' || Array.isArray(opts)) fail(where, `options must be an object, got ${describe(opts)}`);
  for (const k of Object.keys(opts)) {
    if (!allowed.includes(k)) fail(where, `unknown option '${k}' (expected one of: ${allowed.join(', ')})`);
  }
  return opts as Partial<T>;
}

export function str(where: string, name: string, v: unknown, opt: { optional?: boolean; nonEmpty?: boolean } = {}): string | undefined {
  if (v === undefined && opt.optional) return undefined;
  if (typeof v !== 'string') fail(where, `${name} must be a string, got ${describe(v)}`);
  if (opt.nonEmpty !== false && v.length === 0) fail(where, `${name} must not be empty`);
  return v;
}

export function int(where: string, name: string, v: unknown, min: number, max: number, optional = true): number | undefined {
  if (v === undefined && optional) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v)) fail(where, `${name} must be an integer, got ${describe(v)}`);
  if (v < min || v > max) fail(where, `${name} must be from ${min} to ${max}, got ${v}`);
  return v;
}

export function num(where: string, name: string, v: unknown, min: number, max: number): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v)) fail(where, `${name} must be a number, got ${describe(v)}`);
  if (v < min || v > max) fail(where, `${name} must be from ${min} to ${max}, got ${v}`);
  return v;
}

export function bool(where: string, name: string, v: unknown): boolean | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'boolean') fail(where, `${name} must be a boolean, got ${describe(v)}`);
  return v;
}

export function fn<F>(where: string, name: string, v: unknown): F | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'function') fail(where, `${name} must be a function, got ${describe(v)}`);
  return v as F;
}

export function stringMap(where: string, name: string, v: unknown): Record<string, string> | undefined {
  if (v === undefined) return undefined;
  if (v === null || typeof v !== 'object' || Array.isArray(v)) fail(where, `${name} must be an object of strings, got ${describe(v)}`);
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== 'string') fail(where, `${name}.${k} must be a string, got ${describe(val)}`);
  }
  return v as Record<string, string>;
}

export function signalOpt(where: string, v: unknown): AbortSignal | undefined {
  if (v === undefined) return undefined;
  if (!(v instanceof AbortSignal)) fail(where, `signal must be an AbortSignal, got ${describe(v)}`);
  return v;
}

/** Bytes or text for a request body: a string (sent as UTF-8), Uint8Array/Buffer, or ArrayBuffer. */
export function bytesLike(where: string, name: string, v: unknown): Uint8Array | string {
  if (typeof v === 'string' || v instanceof Uint8Array) return v;
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  fail(where, `${name} must be a string, Uint8Array or ArrayBuffer, got ${describe(v)}`);
}

export function toBase64(b: Uint8Array): string {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('base64');
}

export function fromBase64(s: string): Uint8Array {
  const b = Buffer.from(s, 'base64');
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}
