/** The bridge's own version, reported by the status routes. */
export const BRIDGE_VERSION = "0.1.0";
