// Things close together on an axis taken as one (pure: unit-tested in tests/clusters.test.mjs).
// Marks drawn closer than they are wide overprint each other, and the top one swallows the
// clicks meant for those under it: the live page's rebalance strip and the history page's
// mark labels draw each cluster once instead.

// `items` sorted by `at(item)` into clusters: an item less than `gap` after the previous one
// joins that one's cluster. A chain of close items is one cluster, however long.
export function clusterByGap(items, at, gap) {
  const clusters = [];
  for (const item of [...items].sort((a, b) => at(a) - at(b))) {
    const last = clusters[clusters.length - 1];
    if (last && at(item) - at(last[last.length - 1]) < gap) last.push(item);
    else clusters.push([item]);
  }
  return clusters;
}

// How far apart (in the axis' unit) two things must be to be drawn apart, when `span` of
// the axis is drawn over `pixels` and a thing needs `minPixels`.
export const gapFor = (span, pixels, minPixels) => (pixels > 0 ? (span * minPixels) / pixels : span);
