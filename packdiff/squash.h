// Merging a chain of diff layers into one ChangeTree that, stacked on the
// bottom diff's parents, shows what the whole chain showed.
#pragma once

#include <memory>
#include <vector>

#include "packdiff/change_tree.h"
#include "packdiff/lower_stack.h"

namespace strata::packdiff {

// Applies `diffs` (bottom first) in order, as overlayfs stacks them: a
// later entry replaces an earlier one of the same path; a whiteout
// removes it (and what the parents have there); a directory merges with an
// earlier directory (it takes the later attributes and xattrs and stays
// opaque if the earlier one was), and a directory over an earlier
// non-directory or whiteout, or an opaque one, starts empty and opaque.
// File data stays in the diffs (read when written; the chunks are the
// same, so nothing is uploaded again). Non-directories with several names
// in one diff stay hardlinks.
Result<std::shared_ptr<ChangeNode>> SquashDiffs(const std::vector<std::shared_ptr<const PublishedLayer>>& diffs);

}  // namespace strata::packdiff
