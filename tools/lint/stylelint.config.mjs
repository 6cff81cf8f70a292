// Stylelint for the page's CSS (app/static/*.css): the recommended rules (mistakes, not taste).
export default {
  extends: ['stylelint-config-recommended'],
  rules: {
    // Each block overrides what Gradio draws for one part of the page and says why; a later rule
    // of lower specificity for a neighbouring part is no mistake, and reordering the blocks by
    // specificity would tear the explanations apart.
    'no-descending-specificity': null,
  },
};
