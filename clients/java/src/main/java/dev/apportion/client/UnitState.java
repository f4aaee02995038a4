package dev.apportion.client;

/**
 * Nominal owner of a unit (null: nobody), the epoch at which it got it (the unit's fencing
 * token), and a release in progress (null: none).
 */
public record UnitState(String owner, long epoch, Release releasing) {}
